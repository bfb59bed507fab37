#pragma once
// CPU kernels of the element-wise family (ops/elementwise.cc).

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cpu {

enum class BinaryKind { kAdd, kSub, kMul, kDiv };
enum class UnaryKind { kNeg, kExp, kLog, kSqrt, kRsqrt, kTanh, kRelu, kSilu, kGelu, kGeluTanh, kAbs };
enum class ScalarKind { kAdd, kMul, kPow };
// Gradients of activations, given the forward input x or output y and dy.
enum class ActivationGradKind { kReluFromY, kTanhFromY, kSiluFromX, kGeluFromX, kGeluTanhFromX, kAbsFromX };

absl::Status BinaryKernel(KernelContext& ctx, BinaryKind kind);
absl::Status UnaryKernel(KernelContext& ctx, UnaryKind kind);
absl::Status ScalarKernel(KernelContext& ctx, ScalarKind kind, float value);
absl::Status ActivationGradKernel(KernelContext& ctx, ActivationGradKind kind);
// y = x + bias (bias over the last axis), optionally followed by GELU.
absl::Status BiasAddKernel(KernelContext& ctx, bool gelu, bool tanh_approx);
// dx = gelu'(x + bias) * dy.
absl::Status BiasGeluGradKernel(KernelContext& ctx, bool tanh_approx);

}  // namespace tessera::ops::cpu
