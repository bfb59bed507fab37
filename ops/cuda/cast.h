#pragma once
// CUDA kernels of cast and arange (ops/shape_ops.cc registers them for
// DeviceType::kCuda when the build has CUDA): every pair of dtypes with the
// CPU's rules (ops/cpu/shape_ops.cc Cast), arange's values stored by them.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status CastKernel(KernelContext& ctx);
absl::Status ArangeKernel(KernelContext& ctx);

// LaunchCast's type code of `dtype` (-1: none; f64 has no kernels).
int CastCode(DType dtype);

}  // namespace tessera::ops::cuda
