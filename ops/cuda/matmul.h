#pragma once
// CUDA kernels of matmul and batch_matmul (ops/matmul.cc registers them for
// DeviceType::kCuda when the build has CUDA): cuBLAS on one GPU, f32, bf16
// or f16 inputs, f32 output summed in f32 (no TF32). Synchronous.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status MatmulKernel(KernelContext& ctx);
absl::Status BatchMatmulKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
