// Host side of the CUDA optimizer steps (ops/cuda/optimizer.cu): the
// device pointers of the scalar inputs and the attributes to the launchers;
// the kernels read lr, skip and skipped themselves (no host wait) and form
// the per-step scalars in double as the CPU does (ops/cpu/optimizer.cc).

#include "ops/cuda/optimizer.h"

#include "core/text.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

// Optional scalar input `index` in device memory (null when absent).
const float* OptionalScalar(const KernelContext& ctx, int index) {
  return ctx.num_inputs() > index ? ctx.input(index).data<float>() : nullptr;
}

}  // namespace

absl::Status SgdUpdateKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  // (Momentum 0 keeps no buffer: (param, grad, lr[, skip]) -> param'.)
  const bool buffered = ctx.attr().Float("momentum") != 0;
  const int lr = buffered ? 3 : 2;
  return Done(
      LaunchSgd(ctx.input(0).data<float>(), ctx.input(1).data<float>(), buffered ? ctx.input(2).data<float>() : nullptr,
                ctx.output(0).data<float>(), buffered ? ctx.output(1).data<float>() : nullptr,
                ctx.input(0).NumElements(), ctx.input(lr).data<float>(), OptionalScalar(ctx, lr + 1),
                static_cast<float>(ctx.attr().Float("momentum")), static_cast<float>(ctx.attr().Float("weight_decay")),
                ctx.attr().Bool("nesterov")),
      "sgd_update");
}

absl::Status AdamwUpdateKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  AdamwHyper hyper;
  hyper.beta1 = ctx.attr().Float("beta1");
  hyper.beta2 = ctx.attr().Float("beta2");
  hyper.weight_decay = ctx.attr().Float("weight_decay");
  hyper.eps = ctx.attr().Float("eps");
  hyper.bias_correction = ctx.attr().Bool("bias_correction");
  return Done(LaunchAdamw(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                          ctx.input(3).data<float>(), ctx.output(0).data<float>(), ctx.output(1).data<float>(),
                          ctx.output(2).data<float>(), ctx.input(0).NumElements(), ctx.input(4).data<float>(),
                          OptionalScalar(ctx, 5), OptionalScalar(ctx, 6), ctx.step, hyper),
              "adamw_update");
}

absl::Status NonfiniteKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& x = ctx.input(0);
  const int code = x.dtype() == DType::kF32 ? 0 : x.dtype() == DType::kF16 ? 1 : 2;
  return Done(LaunchNonfinite(x.raw_data(), code, x.NumElements(), ctx.output(0).data<float>()), "nonfinite");
}

absl::Status LossScaleUpdateKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  return Done(
      LaunchLossScaleUpdate(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                            ctx.output(0).data<float>(), ctx.output(1).data<float>(), ctx.attr().Float("backoff"),
                            ctx.attr().Float("growth"), ctx.attr().Int("growth_interval")),
      "loss_scale_update");
}

}  // namespace tessera::ops::cuda
