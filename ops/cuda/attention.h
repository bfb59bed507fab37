#pragma once
// CUDA kernels of the fused attention ops (ops/attention.cc registers them
// for DeviceType::kCuda when the build has CUDA): the CPU kernels' contract
// (ops/cpu/attention.h) on one GPU, head dims up to 128.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status FlashAttentionKernel(KernelContext& ctx);
absl::Status FlashAttentionGradKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
