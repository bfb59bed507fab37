#pragma once
// CUDA kernel of cast (ops/shape_ops.cc registers it for DeviceType::kCuda
// when the build has CUDA): every pair of dtypes with the CPU's rules
// (ops/cpu/shape_ops.cc Cast). Synchronous.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status CastKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
