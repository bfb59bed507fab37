#pragma once
// CUDA kernels of the softmax and normalisation family (ops/norm_softmax.cc
// registers them for DeviceType::kCuda when the build has CUDA): the CPU
// kernels' contract (ops/cpu/norm_softmax.h) on one GPU. Synchronous.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status SoftmaxKernel(KernelContext& ctx);
absl::Status LogSoftmaxKernel(KernelContext& ctx);
absl::Status SoftmaxGradKernel(KernelContext& ctx);
absl::Status LogSoftmaxGradKernel(KernelContext& ctx);
absl::Status FusedScaleMaskSoftmaxKernel(KernelContext& ctx);
absl::Status FusedScaleCausalSoftmaxKernel(KernelContext& ctx);
absl::Status LayerNormKernel(KernelContext& ctx);
absl::Status LayerNormGradKernel(KernelContext& ctx);
absl::Status RmsNormKernel(KernelContext& ctx);
absl::Status RmsNormGradKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
