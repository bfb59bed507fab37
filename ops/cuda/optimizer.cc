// Host side of the CUDA optimizer steps (ops/cuda/optimizer.cu): the
// per-step scalars in double as on the CPU (ops/cpu/optimizer.cc), then the
// element loop on the GPU.

#include "ops/cuda/optimizer.h"

#include "core/text.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

// One float of a device tensor (a scalar input), read to the host.
absl::StatusOr<float> Scalar(const KernelContext& ctx, int input) {
  float value = 0.0f;
  const int err = Copy(&value, ctx.input(input).raw_data(), sizeof(float));
  if (err != 0) return absl::InternalError(StrCat("reading input ", input, " of the update: ", ErrorString(err)));
  return value;
}

// The optional skip input after lr is set: the outputs get the inputs'
// values (nothing when they alias them, as in place). Returns whether so.
absl::StatusOr<bool> Skipped(const KernelContext& ctx, int skip_input, int num_outputs) {
  if (ctx.num_inputs() <= skip_input) return false;
  ASSIGN_OR_RETURN(const float skip, Scalar(ctx, skip_input));
  if (skip == 0.0f) return false;
  for (int k = 0; k < num_outputs; ++k) {
    const int from = k == 0 ? 0 : k + 1;  // param, then the state (after grad)
    if (ctx.output(k).raw_data() == ctx.input(from).raw_data()) continue;
    RETURN_IF_ERROR(Done(CopyOnStream(ctx.output(k).raw_data(), ctx.input(from).raw_data(), ctx.input(from).NumBytes()),
                         "skipped update's copy"));
  }
  return true;
}

}  // namespace

absl::Status SgdUpdateKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  ASSIGN_OR_RETURN(const bool skipped, Skipped(ctx, 4, 2));
  if (skipped) return absl::OkStatus();
  ASSIGN_OR_RETURN(const float lr, Scalar(ctx, 3));
  return Done(LaunchSgd(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                        ctx.output(0).data<float>(), ctx.output(1).data<float>(), ctx.input(0).NumElements(), lr,
                        static_cast<float>(ctx.attr().Float("momentum")),
                        static_cast<float>(ctx.attr().Float("weight_decay")), ctx.attr().Bool("nesterov")),
              "sgd_update");
}

absl::Status AdamwUpdateKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  ASSIGN_OR_RETURN(const bool skip, Skipped(ctx, 5, 3));
  if (skip) return absl::OkStatus();
  ASSIGN_OR_RETURN(const float lr_f, Scalar(ctx, 4));
  const double lr = lr_f;
  const double beta1 = ctx.attr().Float("beta1"), beta2 = ctx.attr().Float("beta2");
  double skipped = 0.0;
  if (ctx.num_inputs() > 6) {
    ASSIGN_OR_RETURN(const float s, Scalar(ctx, 6));
    skipped = s;
  }
  const AdamwScalars step =
      AdamwStepScalars(lr, beta1, beta2, ctx.attr().Float("weight_decay"), ctx.attr().Float("eps"),
                       ctx.attr().Bool("bias_correction"), static_cast<double>(ctx.step + 1) - skipped);
  return Done(LaunchAdamw(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                          ctx.input(3).data<float>(), ctx.output(0).data<float>(), ctx.output(1).data<float>(),
                          ctx.output(2).data<float>(), ctx.input(0).NumElements(), step),
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
