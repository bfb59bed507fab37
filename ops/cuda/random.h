#pragma once
// CUDA dropout (ops/random.cc registers it for DeviceType::kCuda when the
// build has CUDA): the CPU's masks, bit for bit, since both draw each
// element's Philox numbers by its global index. Synchronous.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status DropoutKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
