#pragma once
// CPU kernels of the fused attention ops (ops/attention.cc): softmax(scale ·
// q kᵀ) v without the (T, S) score matrix, tiled flash-style (online softmax
// over key blocks, GEMMs per tile through oneDNN on the calling thread), and
// its backward from the saved log-sum-exp. Work is cut over the pool by
// (batch·head, query block) forward and by batch·head backward; every
// sum has one order, so results do not depend on the thread count.

#include <cstdint>

#include "absl/status/status.h"
#include "ops/attention_shape.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cpu {

// flash_attention(q, k, v) and flash_attention_masked(q, k, v, mask)
// -> (y, lse).
absl::Status FlashAttentionKernel(KernelContext& ctx);
// flash_attention_grad(q, k, v, y, lse, dy) and
// flash_attention_masked_grad(q, k, v, y, lse, dy, mask) -> (dq, dk, dv).
absl::Status FlashAttentionGradKernel(KernelContext& ctx);

}  // namespace tessera::ops::cpu

namespace tessera::ops {

// From a fused attention op's context (forward or gradient: q, k, v are its
// first three inputs, the mask its last when `masked`); see
// ops/attention_shape.h.
AttentionShape AttentionShapeOf(const KernelContext& ctx, bool masked);

}  // namespace tessera::ops
