#pragma once
// CUDA kernels of the makers and selections of the shape family
// (ops/shape_ops.cc registers them for DeviceType::kCuda when the build has
// CUDA): fill, zeros and ones store the CPU's bit pattern of the value in
// the output's dtype (ops/cpu/shape_ops.h ElementBits); where and
// masked_fill select element by element with numpy broadcasting up to rank
// 8, any dtype.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

// Output 0 = `value` everywhere.
absl::Status FillKernel(KernelContext& ctx, double value);
// where(cond, x, y) -> out.
absl::Status WhereKernel(KernelContext& ctx);
// masked_fill(x, mask) -> y with attribute `value`.
absl::Status MaskedFillKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
