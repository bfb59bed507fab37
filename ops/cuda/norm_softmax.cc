// Host side of the CUDA row kernels (ops/cuda/norm_softmax.cu): rows of the
// last axis, the causal offsets from the input's slice, the launchers.

#include "ops/cuda/norm_softmax.h"

#include "core/text.h"
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

// The fused attention softmax (ops/cpu/norm_softmax.cc's rules): keys
// dropped where `mask` (bool, broadcastable to x; null: none) is false and,
// when causal, past the query's global position, which comes from the input
// slice (x may be split along T).
absl::Status ScaleMaskSoftmax(KernelContext& ctx, const Tensor* mask, float scale, bool causal) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& x = ctx.input(0);  // (..., T, S), rank >= 2 (InferFusedSoftmax)
  const int rank = x.shape().rank();
  if (rank > kMaxRank) {
    return absl::UnimplementedError(StrCat("CUDA attention softmax up to rank ", kMaxRank, ", got ", rank));
  }
  AttentionLayout layout;
  layout.rank = rank;
  for (int a = 0; a < rank; ++a) layout.dims[a] = x.shape()[a];
  if (mask != nullptr) {
    const Shape& ms = mask->shape();
    const std::vector<int64_t> strides = ms.Strides();
    const int lead = rank - ms.rank();
    for (int a = lead; a < rank; ++a) {
      if (ms[a - lead] != 1) layout.mask_strides[a] = strides[static_cast<size_t>(a - lead)];
    }
  }
  const TensorSlice slice = ctx.input_slice(0);
  const int64_t t_offset = slice.offset[static_cast<size_t>(rank - 2)];
  const int64_t diagonal = slice.logical[rank - 1] - slice.logical[rank - 2];
  return Done(LaunchScaleMaskSoftmax(x.data<float>(), ctx.output(0).data<float>(),
                                     mask == nullptr ? nullptr : static_cast<const uint8_t*>(mask->raw_data()), layout,
                                     causal, t_offset, diagonal, scale),
              "attention softmax");
}

}  // namespace

absl::Status SoftmaxKernel(KernelContext& ctx) { return Softmax(ctx, false); }
absl::Status LogSoftmaxKernel(KernelContext& ctx) { return Softmax(ctx, true); }
absl::Status SoftmaxGradKernel(KernelContext& ctx) { return SoftmaxGrad(ctx, false); }
absl::Status LogSoftmaxGradKernel(KernelContext& ctx) { return SoftmaxGrad(ctx, true); }

absl::Status FusedScaleMaskSoftmaxKernel(KernelContext& ctx) {
  return ScaleMaskSoftmax(ctx, &ctx.input(1), static_cast<float>(ctx.attr().Float("scale")), ctx.attr().Bool("causal"));
}

absl::Status FusedScaleCausalSoftmaxKernel(KernelContext& ctx) {
  return ScaleMaskSoftmax(ctx, nullptr, static_cast<float>(ctx.attr().Float("scale")), /*causal=*/true);
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
  return Done(
      LaunchLayerNormGrad(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                          ctx.input(3).data<float>(), ctx.input(4).data<float>(), ctx.output(0).data<float>(),
                          ctx.output(1).data<float>(), ctx.output(2).data<float>(), v.rows, v.cols, WorkspaceOf(ctx),
                          WorkspaceBytesOf(ctx), ctx.num_inputs() > 5 ? ctx.input(5).data<float>() : nullptr),
      ctx.num_inputs() > 5 ? "layer_norm_grad_add" : "layer_norm_grad");
}

absl::Status RmsNormKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Rows v = RowsOf(ctx.input(0));
  return Done(LaunchRmsNorm(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.output(0).data<float>(),
                            ctx.output(1).data<float>(), v.rows, v.cols, static_cast<float>(ctx.attr().Float("eps"))),
              "rms_norm");
}

absl::Status RmsNormGradKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Rows v = RowsOf(ctx.input(1));
  return Done(LaunchRmsNormGrad(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                                ctx.input(3).data<float>(), ctx.output(0).data<float>(), ctx.output(1).data<float>(),
                                v.rows, v.cols, WorkspaceOf(ctx), WorkspaceBytesOf(ctx)),
              "rms_norm_grad");
}

}  // namespace tessera::ops::cuda
