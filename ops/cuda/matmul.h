#pragma once
// CUDA kernels of matmul and batch_matmul (ops/matmul.cc registers them for
// DeviceType::kCuda when the build has CUDA): cuBLAS on one GPU, f32, bf16
// or f16 inputs, f32 output summed in f32 (no TF32), launched on the
// context's stream.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status MatmulKernel(KernelContext& ctx);
absl::Status BatchMatmulKernel(KernelContext& ctx);
// matmul_add: matmul with the addend as cuBLASLt's C (beta 1).
absl::Status MatmulAddKernel(KernelContext& ctx);
// matmul_bias through cuBLASLt's BIAS epilogue (the GEMM, then the bias,
// where cuBLASLt has no kernel).
absl::Status MatmulBiasKernel(KernelContext& ctx);
// matmul_bias_gelu through cuBLASLt: bf16 / f16 with the tanh GELU all in
// its GELU_AUX_BIAS epilogue (N a multiple of 8); otherwise the bias in its
// epilogue and the GELU kernel after (the GEMM, the bias and the GELU where
// cuBLASLt has no kernel).
absl::Status MatmulBiasGeluKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
