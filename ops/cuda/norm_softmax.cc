// Host side of the CUDA row kernels (ops/cuda/norm_softmax.cu): rows of the
// last axis, the causal offsets from the input's slice, the launchers.

#include "ops/cuda/norm_softmax.h"

#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

struct Rows {
  int64_t rows = 0, cols = 0;
};
Rows RowsOf(const Tensor& t) {
  const int64_t C = t.shape().rank() == 0 ? 1 : t.shape()[t.shape().rank() - 1];
  return {C == 0 ? 0 : t.NumElements() / C, C};
}

absl::Status Softmax(KernelContext& ctx, bool log) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Rows v = RowsOf(ctx.input(0));
  return Done(LaunchSoftmax(ctx.input(0).data<float>(), ctx.output(0).data<float>(), v.rows, v.cols, log),
              log ? "log_softmax" : "softmax");
}

absl::Status SoftmaxGrad(KernelContext& ctx, bool log) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Rows v = RowsOf(ctx.input(0));
  return Done(LaunchSoftmaxGrad(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.output(0).data<float>(),
                                v.rows, v.cols, log),
              log ? "log_softmax_grad" : "softmax_grad");
}

}  // namespace

absl::Status SoftmaxKernel(KernelContext& ctx) { return Softmax(ctx, false); }
absl::Status LogSoftmaxKernel(KernelContext& ctx) { return Softmax(ctx, true); }
absl::Status SoftmaxGradKernel(KernelContext& ctx) { return SoftmaxGrad(ctx, false); }
absl::Status LogSoftmaxGradKernel(KernelContext& ctx) { return SoftmaxGrad(ctx, true); }

absl::Status FusedScaleCausalSoftmaxKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& x = ctx.input(0);  // (..., T, S), rank >= 2 (InferFusedSoftmax)
  const int rank = x.shape().rank();
  const int64_t T = x.shape()[rank - 2], S = x.shape()[rank - 1];
  // Query t's global position and the diagonal S - T come from the logical
  // tensor, as x may be split along T (ops/cpu/norm_softmax.cc).
  const TensorSlice slice = ctx.input_slice(0);
  const int64_t t_offset = slice.offset[static_cast<size_t>(rank - 2)];
  const int64_t diagonal = slice.logical[rank - 1] - slice.logical[rank - 2];
  return Done(LaunchCausalSoftmax(x.data<float>(), ctx.output(0).data<float>(), S == 0 ? 0 : x.NumElements() / S, T, S,
                                  t_offset, diagonal, static_cast<float>(ctx.attr().Float("scale"))),
              "fused_scale_causal_softmax");
}

absl::Status LayerNormKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Rows v = RowsOf(ctx.input(0));
  return Done(LaunchLayerNorm(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                              ctx.output(0).data<float>(), ctx.output(1).data<float>(), ctx.output(2).data<float>(),
                              v.rows, v.cols, static_cast<float>(ctx.attr().Float("eps"))),
              "layer_norm");
}

absl::Status LayerNormGradKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Rows v = RowsOf(ctx.input(1));
  return Done(LaunchLayerNormGrad(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                                  ctx.input(3).data<float>(), ctx.input(4).data<float>(), ctx.output(0).data<float>(),
                                  ctx.output(1).data<float>(), ctx.output(2).data<float>(), v.rows, v.cols),
              "layer_norm_grad");
}

}  // namespace tessera::ops::cuda
