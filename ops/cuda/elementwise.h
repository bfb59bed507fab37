#pragma once
// CUDA kernels of the element-wise family (ops/elementwise.cc registers them
// for DeviceType::kCuda when the build has CUDA): the CPU kernels' contract
// (ops/cpu/elementwise.h) on tensors in one GPU's memory. Synchronous: each
// returns once its kernel has run (on the thread's default stream).

#include "absl/status/status.h"
#include "ops/cpu/elementwise.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

absl::Status BinaryKernel(KernelContext& ctx, cpu::BinaryKind kind);
absl::Status UnaryKernel(KernelContext& ctx, cpu::UnaryKind kind);
absl::Status ScalarKernel(KernelContext& ctx, cpu::ScalarKind kind, float value);
absl::Status ActivationGradKernel(KernelContext& ctx, cpu::ActivationGradKind kind);
absl::Status BiasAddKernel(KernelContext& ctx, bool gelu, bool tanh_approx);
absl::Status BiasGeluGradKernel(KernelContext& ctx, bool tanh_approx);

}  // namespace tessera::ops::cuda
