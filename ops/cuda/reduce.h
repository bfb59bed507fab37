#pragma once
// CUDA kernels of the reductions (ops/reduce.cc dispatches to them on
// DeviceType::kCuda when the build has CUDA): the contract of ops/cpu/reduce.h
// on one GPU. Synchronous.

#include <vector>

#include "absl/status/status.h"
#include "ops/cpu/reduce.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status Reduce(const KernelContext& ctx, cpu::ReduceKind kind, const Tensor& x, const std::vector<bool>& reduced,
                    float scale, const Tensor& y);
absl::Status SquareSum(const KernelContext& ctx, const Tensor& x, const Tensor& y);
absl::Status ReduceMaxGrad(const KernelContext& ctx, const Tensor& x, const std::vector<bool>& reduced, const Tensor& y,
                           const Tensor& dy, const Tensor& dx);
// The lowest index of the max along `axis`; NaN is skipped (a row of NaN
// gives 0), as cpu::Argmax on last-axis rows.
absl::Status Argmax(const KernelContext& ctx, const Tensor& x, int axis, const Tensor& y);
// The k largest of each last-axis row, as cpu::TopK (k rounds of a block
// reduction per row: O(k n), for small k).
absl::Status TopK(const KernelContext& ctx, const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices);

}  // namespace tessera::ops::cuda
