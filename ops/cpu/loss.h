#pragma once
// CPU kernels of the cross-entropy family (schemas in ops/loss.cc). Labels
// are i32 or i64 class ids; an id outside [0, V) is an InvalidArgument error
// naming the id, its row and V.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cpu {

// The labels (i32 or i64, host memory) as i64, each checked to lie in
// [0, V): else the error naming the label, its row and V.
absl::StatusOr<std::vector<int64_t>> ReadLabels(const Tensor& labels, int64_t V);

// (logits (N, V), labels (N)) -> loss (N).
absl::Status SparseSoftmaxCrossEntropyKernel(KernelContext& ctx);
// (logits (N, V), labels (N), dloss (N)) -> dlogits (N, V).
absl::Status SparseSoftmaxCrossEntropyGradKernel(KernelContext& ctx);
// (logits (N, Vshard), row_max (N, 1), labels (N)) -> (sumexp (N, 1), label_logit (N, 1)).
absl::Status CrossEntropyPartialsKernel(KernelContext& ctx);
// (logits, row_max, labels, d_sumexp (N, 1), d_label_logit (N, 1)) -> dlogits (N, Vshard).
absl::Status CrossEntropyPartialsGradKernel(KernelContext& ctx);

}  // namespace tessera::ops::cpu
