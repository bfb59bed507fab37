#pragma once
// CUDA kernels of cross-entropy, fused and vocabulary-parallel (ops/loss.cc
// registers them for DeviceType::kCuda when the build has CUDA): the CPU kernels'
// contract (ops/cpu/loss.h) on one GPU. The labels are read to the host and
// checked there, with the CPU's error. Synchronous.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status CrossEntropyPartialsKernel(KernelContext& ctx);
absl::Status CrossEntropyPartialsGradKernel(KernelContext& ctx);
absl::Status SparseSoftmaxCrossEntropyKernel(KernelContext& ctx);
absl::Status SparseSoftmaxCrossEntropyGradKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
