#pragma once
// The data movement the shape ops' kernels are made of (reshape, transpose,
// broadcast_to, slice and its gradient, concat, split, depend), on the
// context's device: the CPU's multithreaded loops (ops/cpu/shape_ops.h), or
// one strided copy kernel on CUDA (ops/cuda/shape_ops.cu). So each of those
// ops has one kernel, registered for every device type the build has.

#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "ops/kernel_context.h"

namespace tessera::ops::movement {

// y's bytes = x's (nothing when they are the same buffer).
absl::Status CopyElements(const KernelContext& ctx, const Tensor& x, const Tensor& y);
absl::Status ZeroFill(const KernelContext& ctx, const Tensor& y);
// y = x broadcast to y's shape (numpy rules).
absl::Status BroadcastTo(const KernelContext& ctx, const Tensor& x, const Tensor& y);
// y's axis i = x's axis perm[i].
absl::Status Transpose(const KernelContext& ctx, const Tensor& x, const std::vector<int>& perm, const Tensor& y);
// The block of `extent` at src_start in src, to dst_start in dst.
absl::Status CopyBlock(const KernelContext& ctx, const Tensor& src, const std::vector<int64_t>& src_start,
                       const Tensor& dst, const std::vector<int64_t>& dst_start, const Shape& extent);

}  // namespace tessera::ops::movement
