#pragma once
// CUDA kernels of embedding and embedding_grad (ops/embedding.cc registers
// them for DeviceType::kCuda when the build has CUDA): the CPU kernels'
// contract (ops/cpu/embedding.h, vocabulary shards and the id check
// included) on one GPU. embedding_grad sums in id order, as the CPU.
// Synchronous.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status EmbeddingKernel(KernelContext& ctx);
absl::Status EmbeddingGradKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
