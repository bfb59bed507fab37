#pragma once
// CUDA kernels of sgd_update, adamw_update, nonfinite and loss_scale_update
// (ops/optimizer.cc registers them for DeviceType::kCuda when the build has CUDA): the CPU kernels'
// contract (ops/cpu/optimizer.h) on one GPU, the optional skip and skipped
// inputs included. The scalar inputs (lr, skip, skipped) are read by the
// kernels on the device, so a launch on a stream never waits for it.

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status SgdUpdateKernel(KernelContext& ctx);
absl::Status AdamwUpdateKernel(KernelContext& ctx);
absl::Status NonfiniteKernel(KernelContext& ctx);
absl::Status LossScaleUpdateKernel(KernelContext& ctx);

}  // namespace tessera::ops::cuda
