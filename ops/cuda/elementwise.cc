// Host side of the CUDA element-wise kernels: checks where the tensors live,
// lays out broadcasting, and calls the launchers (ops/cuda/launch.h).

#include "ops/cuda/elementwise.h"

#include "core/text.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
// The launchers take the CPU enums by value (elementwise.cu lists them).
static_assert(static_cast<int>(cpu::BinaryKind::kDiv) == 3);
static_assert(static_cast<int>(cpu::UnaryKind::kAbs) == 10);
static_assert(static_cast<int>(cpu::ScalarKind::kPow) == 2);
static_assert(static_cast<int>(cpu::ActivationGradKind::kAbsFromX) == 5);

absl::Status BinaryKernel(KernelContext& ctx, cpu::BinaryKind kind) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Shape& out = ctx.output(0).shape();
  if (out.rank() > kMaxRank) {
    return absl::UnimplementedError(
        StrCat("CUDA binary kernels broadcast up to rank ", kMaxRank, ", got ", out.rank()));
  }
  Broadcast shape;
  shape.rank = out.rank();
  for (int d = 0; d < out.rank(); ++d) shape.dims[d] = out[d];
  // Strides of each input aligned to the output's trailing axes, 0 where it
  // broadcasts (numpy rules, as InferBroadcast checked).
  for (int k = 0; k < 2; ++k) {
    const Shape& in = ctx.input(k).shape();
    const std::vector<int64_t> own = in.Strides();
    int64_t* strides = k == 0 ? shape.a_strides : shape.b_strides;
    const int lead = out.rank() - in.rank();
    for (int d = 0; d < in.rank(); ++d) strides[d + lead] = in[d] == 1 ? 0 : own[static_cast<size_t>(d)];
  }
  return Done(LaunchBinary(static_cast<int>(kind), ctx.input(0).data<float>(), ctx.input(1).data<float>(),
                           ctx.output(0).data<float>(), ctx.output(0).NumElements(), shape),
              "binary");
}

absl::Status UnaryKernel(KernelContext& ctx, cpu::UnaryKind kind) {
  RETURN_IF_ERROR(OnDevice(ctx));
  return Done(LaunchUnary(static_cast<int>(kind), ctx.input(0).data<float>(), ctx.output(0).data<float>(),
                          ctx.output(0).NumElements()),
              "unary");
}

absl::Status ScalarKernel(KernelContext& ctx, cpu::ScalarKind kind, float value) {
  RETURN_IF_ERROR(OnDevice(ctx));
  return Done(LaunchScalar(static_cast<int>(kind), ctx.input(0).data<float>(), ctx.output(0).data<float>(),
                           ctx.output(0).NumElements(), value),
              "scalar");
}

absl::Status ActivationGradKernel(KernelContext& ctx, cpu::ActivationGradKind kind) {
  RETURN_IF_ERROR(OnDevice(ctx));
  return Done(LaunchActivationGrad(static_cast<int>(kind), ctx.input(0).data<float>(), ctx.input(1).data<float>(),
                                   ctx.output(0).data<float>(), ctx.output(0).NumElements()),
              "activation gradient");
}

absl::Status BiasAddKernel(KernelContext& ctx, bool gelu, bool tanh_approx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Shape& x = ctx.input(0).shape();
  const int64_t C = x[x.rank() - 1];
  return Done(LaunchBiasAdd(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.output(0).data<float>(),
                            C == 0 ? 0 : x.NumElements() / C, C, gelu ? (tanh_approx ? 2 : 1) : 0),
              "bias");
}

absl::Status BiasGeluGradKernel(KernelContext& ctx, bool tanh_approx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Shape& x = ctx.input(0).shape();
  const int64_t C = x[x.rank() - 1];
  return Done(LaunchBiasGeluGrad(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                                 ctx.output(0).data<float>(), C == 0 ? 0 : x.NumElements() / C, C, tanh_approx),
              "bias_gelu_grad");
}

}  // namespace tessera::ops::cuda
