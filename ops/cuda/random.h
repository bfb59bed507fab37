#pragma once
// CUDA dropout (and bias_dropout_add), uniform and normal (ops/random.cc registers them for
// DeviceType::kCuda when the build has CUDA): each element's Philox numbers
// drawn by its global index, as on the CPU, so dropout's masks are the
// CPU's bit for bit and uniform's and normal's values agree with the CPU's
// to float rounding (ops/cuda/launch.h).

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status DropoutKernel(KernelContext& ctx);
absl::Status BiasDropoutAddKernel(KernelContext& ctx);
absl::Status UniformKernel(KernelContext& ctx);
absl::Status NormalKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
