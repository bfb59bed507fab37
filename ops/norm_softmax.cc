// Normalisation and softmax ops, all over the last axis (a tensor (..., C) is
// rows of C): softmax, log_softmax, the fused attention softmaxes (scale +
// padding mask and/or causal mask), layer_norm and rms_norm, each with its
// gradient op. Kernels: ops/cpu/norm_softmax.cc.
//
// SBP: a row's result depends only on that row, so every axis before the last
// may be split (per-channel parameters gamma/beta broadcast, their gradients
// partial); the last axis never is. Gradient ops are linear in dy, so a
// partial dy with everything else broadcast gives partial outputs.

#include <string>

#include "core/text.h"
#include "ops/cpu/norm_softmax.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/norm_softmax.h"
#endif
#include "ops/op_util.h"
#include "ops/reduce_chunks.h"
#include "ops/registry.h"

namespace tessera::ops {
namespace {

// What each input / output of a row-wise op is: a row tensor (split with the
// rows) or a per-channel parameter (broadcast as an input; partial as an
// output, being a sum over rows).
enum class Role { kRows, kParam };

// For every axis a before the last of a rank-`rank` row tensor: rows S(a),
// parameter inputs B → rows S(a), parameter outputs P. Plus all B.
std::vector<SbpSignature> RowSplitSignatures(int rank, const std::vector<Role>& inputs,
                                             const std::vector<Role>& outputs) {
  std::vector<SbpSignature> sigs;
  for (int axis = 0; axis + 1 < rank; ++axis) {
    SbpSignature sig;
    for (Role r : inputs) sig.inputs.push_back(r == Role::kRows ? Sbp::Split(axis) : Sbp::Broadcast());
    for (Role r : outputs) sig.outputs.push_back(r == Role::kRows ? Sbp::Split(axis) : Sbp::PartialSum());
    sigs.push_back(std::move(sig));
  }
  sigs.push_back(
      {std::vector<Sbp>(inputs.size(), Sbp::Broadcast()), std::vector<Sbp>(outputs.size(), Sbp::Broadcast())});
  return sigs;
}

// Gradient ops (dy first): linear in dy, so P on dy with the rest B gives P.
void AddPartialDy(size_t num_inputs, size_t num_outputs, std::vector<SbpSignature>& sigs) {
  std::vector<Sbp> ins(num_inputs, Sbp::Broadcast());
  ins[0] = Sbp::PartialSum();
  sigs.push_back({ins, std::vector<Sbp>(num_outputs, Sbp::PartialSum())});
}

Shape WithoutLastAxis(const Shape& shape) {
  std::vector<int64_t> dims = shape.dims();
  dims.pop_back();
  return Shape(std::move(dims));
}

absl::Status ExpectSameShape(const TensorMeta& meta, const Shape& shape, std::string_view name, std::string_view like) {
  if (meta.shape == shape) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat("input '", name, "' must have shape ", shape.ToString(), " (", like, "), got ", meta.shape.ToString()));
}

absl::Status ExpectNonNegativeEps(const AttrMap& attrs) {
  const double eps = attrs.Float("eps");
  if (eps >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat("attribute 'eps' must be >= 0, got ", eps));
}

// x: f32 of rank >= 1 with a non-empty last axis (the normalised one).
absl::Status ExpectNormInput(const TensorMeta& x, std::string_view name) {
  RETURN_IF_ERROR(ExpectDType(x, DType::kF32, name));
  RETURN_IF_ERROR(ExpectRank(x, 1, name, /*at_least=*/true));
  if (x.shape[x.shape.rank() - 1] == 0) {
    return absl::InvalidArgumentError(
        StrCat("input '", name, "' has an empty last axis, nothing to normalise: ", x.shape.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectChannelParam(const TensorMeta& param, const Shape& x_shape, std::string_view name) {
  RETURN_IF_ERROR(ExpectDType(param, DType::kF32, name));
  const Shape want{x_shape[x_shape.rank() - 1]};
  return ExpectSameShape(param, want, name, "the last axis of x");
}

// ---- softmax, log_softmax

absl::StatusOr<std::vector<TensorMeta>> InferSoftmax(const std::vector<TensorMeta>& in, const AttrMap&) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "x"));
  RETURN_IF_ERROR(ExpectRank(in[0], 1, "x", /*at_least=*/true));
  return std::vector<TensorMeta>{in[0]};
}

absl::StatusOr<std::vector<TensorMeta>> InferSoftmaxGrad(const std::vector<TensorMeta>& in, const AttrMap&) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "y"));
  RETURN_IF_ERROR(ExpectDType(in[1], DType::kF32, "dy"));
  RETURN_IF_ERROR(ExpectRank(in[0], 1, "y", /*at_least=*/true));
  RETURN_IF_ERROR(ExpectSameShape(in[1], in[0].shape, "dy", "like y"));
  return std::vector<TensorMeta>{in[0]};
}

std::vector<SbpSignature> SoftmaxSignatures(const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
  return RowSplitSignatures(in[0].shape.rank(), {Role::kRows}, {Role::kRows});
}

std::vector<SbpSignature> SoftmaxGradSignatures(const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
  auto sigs = RowSplitSignatures(in[0].shape.rank(), {Role::kRows, Role::kRows}, {Role::kRows});
  // dx = y * (dy - Σ y·dy) and dy - exp(y)·Σ dy are linear in dy (y broadcast).
  sigs.push_back({{Sbp::Broadcast(), Sbp::PartialSum()}, {Sbp::PartialSum()}});
  return sigs;
}

void RegisterSoftmax(OpRegistry& r) {
  const TensorMeta example{DType::kF32, Shape{4, 6}};
  r.MustRegister(OpSchema("softmax")
                     .Doc("y = exp(x) / Σ exp(x) over the last axis (max-subtracted, so large logits do not "
                          "overflow). Gradient: softmax_grad.")
                     .Input("x")
                     .Output("y")
                     .Infer(InferSoftmax)
                     .Sbp(SoftmaxSignatures)
                     .Grad([](GradBuilder& b) {
                       b.SetInputGrad(0, b.Op("softmax_grad", {b.output(0), b.OutputGradOrZeros(0)}));
                     })
                     .Kernel(DeviceType::kCpu, cpu::SoftmaxKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::SoftmaxKernel)
#endif
                     .Example({example}));
  r.MustRegister(OpSchema("softmax_grad")
                     .Doc("dx = y * (dy - Σ y·dy) over the last axis, for y = softmax(x).")
                     .Input("y")
                     .Input("dy")
                     .Output("dx")
                     .Infer(InferSoftmaxGrad)
                     .Sbp(SoftmaxGradSignatures)
                     .Kernel(DeviceType::kCpu, cpu::SoftmaxGradKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::SoftmaxGradKernel)
#endif
                     .Example({example, example}));
  r.MustRegister(OpSchema("log_softmax")
                     .Doc("y = x - log Σ exp(x) over the last axis. Gradient: log_softmax_grad.")
                     .Input("x")
                     .Output("y")
                     .Infer(InferSoftmax)
                     .Sbp(SoftmaxSignatures)
                     .Grad([](GradBuilder& b) {
                       b.SetInputGrad(0, b.Op("log_softmax_grad", {b.output(0), b.OutputGradOrZeros(0)}));
                     })
                     .Kernel(DeviceType::kCpu, cpu::LogSoftmaxKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::LogSoftmaxKernel)
#endif
                     .Example({example}));
  r.MustRegister(OpSchema("log_softmax_grad")
                     .Doc("dx = dy - exp(y) * Σ dy over the last axis, for y = log_softmax(x).")
                     .Input("y")
                     .Input("dy")
                     .Output("dx")
                     .Infer(InferSoftmaxGrad)
                     .Sbp(SoftmaxGradSignatures)
                     .Kernel(DeviceType::kCpu, cpu::LogSoftmaxGradKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::LogSoftmaxGradKernel)
#endif
                     .Example({example, example}));
}

// ---- fused attention softmax

absl::StatusOr<std::vector<TensorMeta>> InferFusedSoftmax(const std::vector<TensorMeta>& in, const AttrMap&) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "x"));
  RETURN_IF_ERROR(ExpectRank(in[0], 2, "x", /*at_least=*/true));
  if (in.size() == 2) {
    RETURN_IF_ERROR(ExpectDType(in[1], DType::kBool, "mask"));
    const Shape& x = in[0].shape;
    const Shape& mask = in[1].shape;
    bool ok = mask.rank() <= x.rank();
    for (int a = 0; ok && a < mask.rank(); ++a) {
      const int64_t extent = mask[a];
      ok = extent == 1 || extent == x[a + x.rank() - mask.rank()];
    }
    if (!ok) {
      return absl::InvalidArgumentError(StrCat("mask ", mask.ToString(), " does not broadcast to x ", x.ToString(),
                                               " (each mask axis must be 1 or match x, aligned from the right)"));
    }
  }
  return std::vector<TensorMeta>{in[0]};
}

// x (..., T, S): S on any axis but the keys (T included: the kernel reads the
// query offset of its shard from the input slice, so the causal diagonal
// stays put). The mask splits along with x where it has a non-1 extent and
// broadcasts where it has 1 (or lacks the axis).
std::vector<SbpSignature> FusedSoftmaxSignatures(const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
  const Shape& x = in[0].shape;
  std::vector<SbpSignature> sigs;
  for (int axis = 0; axis + 1 < x.rank(); ++axis) {
    SbpSignature sig{{Sbp::Split(axis)}, {Sbp::Split(axis)}};
    if (in.size() == 2) {
      const Shape& mask = in[1].shape;
      const int mask_axis = axis - (x.rank() - mask.rank());
      sig.inputs.push_back(mask_axis < 0 || mask[mask_axis] == 1 ? Sbp::Broadcast() : Sbp::Split(mask_axis));
    }
    sigs.push_back(std::move(sig));
  }
  sigs.push_back({std::vector<Sbp>(in.size(), Sbp::Broadcast()), {Sbp::Broadcast()}});
  return sigs;
}

// dx = scale * softmax_grad(y, dy): masked keys have y = 0, so they get no
// gradient, and neither does the mask.
void FusedSoftmaxGrad(GradBuilder& b) {
  ValueId dx = b.Op("softmax_grad", {b.output(0), b.OutputGradOrZeros(0)});
  const double scale = b.attrs().Float("scale");
  if (scale != 1.0) dx = b.Op("scalar_mul", {dx}, {{"value", scale}});
  b.SetInputGrad(0, dx);
}

void RegisterFusedSoftmax(OpRegistry& r) {
  r.MustRegister(
      OpSchema("fused_scale_mask_softmax")
          .Doc("Attention probabilities: y = softmax(scale * x) over the last axis of scores x (..., T, S), "
               "with keys dropped (-inf before the softmax) where the bool padding mask is false (mask "
               "broadcasts to x, e.g. (B, 1, 1, S) or (B, 1, T, S); true = keep) and, if causal, where key "
               "s > t + (S - T). A row with every key dropped gives zeros, not NaN. Gradient: scale * "
               "softmax_grad(y, dy).")
          .Input("x")
          .NonDifferentiableInput("mask")
          .Output("y")
          .Attr("scale", AttrType::kFloat, 1.0)
          .Attr("causal", AttrType::kBool, false)
          .Infer(InferFusedSoftmax)
          .Sbp(FusedSoftmaxSignatures)
          .Grad(FusedSoftmaxGrad)
          .Kernel(DeviceType::kCpu, cpu::FusedScaleMaskSoftmaxKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::FusedScaleMaskSoftmaxKernel)
#endif
          .Example({{DType::kF32, Shape{2, 4, 8, 8}}, {DType::kBool, Shape{2, 1, 1, 8}}}, {{"scale", 0.25}}));
  r.MustRegister(OpSchema("fused_scale_causal_softmax")
                     .Doc("Causal attention probabilities: y = softmax(scale * x) over the last axis of scores "
                          "x (..., T, S) with keys s > t + (S - T) dropped; a row with every key dropped (T > S) "
                          "gives zeros. Gradient: scale * softmax_grad(y, dy).")
                     .Input("x")
                     .Output("y")
                     .Attr("scale", AttrType::kFloat, 1.0)
                     .Infer(InferFusedSoftmax)
                     .Sbp(FusedSoftmaxSignatures)
                     .Grad(FusedSoftmaxGrad)
                     .Kernel(DeviceType::kCpu, cpu::FusedScaleCausalSoftmaxKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::FusedScaleCausalSoftmaxKernel)
#endif
                     .Example({{DType::kF32, Shape{2, 4, 8, 8}}}, {{"scale", 0.25}}));
}

// ---- layer_norm, rms_norm

absl::StatusOr<std::vector<TensorMeta>> InferLayerNorm(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(ExpectNonNegativeEps(attrs));
  RETURN_IF_ERROR(ExpectNormInput(in[0], "x"));
  RETURN_IF_ERROR(ExpectChannelParam(in[1], in[0].shape, "gamma"));
  RETURN_IF_ERROR(ExpectChannelParam(in[2], in[0].shape, "beta"));
  const TensorMeta stats{DType::kF32, WithoutLastAxis(in[0].shape)};
  return std::vector<TensorMeta>{in[0], stats, stats};
}

absl::StatusOr<std::vector<TensorMeta>> InferLayerNormGrad(const std::vector<TensorMeta>& in, const AttrMap&) {
  RETURN_IF_ERROR(ExpectNormInput(in[1], "x"));
  const Shape& x = in[1].shape;
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "dy"));
  RETURN_IF_ERROR(ExpectSameShape(in[0], x, "dy", "like x"));
  const Shape stats = WithoutLastAxis(x);
  RETURN_IF_ERROR(ExpectDType(in[2], DType::kF32, "mean"));
  RETURN_IF_ERROR(ExpectSameShape(in[2], stats, "mean", "x without its last axis"));
  RETURN_IF_ERROR(ExpectDType(in[3], DType::kF32, "rstd"));
  RETURN_IF_ERROR(ExpectSameShape(in[3], stats, "rstd", "x without its last axis"));
  RETURN_IF_ERROR(ExpectChannelParam(in[4], x, "gamma"));
  return std::vector<TensorMeta>{in[1], in[4], in[4]};
}

absl::StatusOr<std::vector<TensorMeta>> InferRmsNorm(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(ExpectNonNegativeEps(attrs));
  RETURN_IF_ERROR(ExpectNormInput(in[0], "x"));
  RETURN_IF_ERROR(ExpectChannelParam(in[1], in[0].shape, "gamma"));
  return std::vector<TensorMeta>{in[0], {DType::kF32, WithoutLastAxis(in[0].shape)}};
}

absl::StatusOr<std::vector<TensorMeta>> InferRmsNormGrad(const std::vector<TensorMeta>& in, const AttrMap&) {
  RETURN_IF_ERROR(ExpectNormInput(in[1], "x"));
  const Shape& x = in[1].shape;
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "dy"));
  RETURN_IF_ERROR(ExpectSameShape(in[0], x, "dy", "like x"));
  RETURN_IF_ERROR(ExpectDType(in[2], DType::kF32, "rstd"));
  RETURN_IF_ERROR(ExpectSameShape(in[2], WithoutLastAxis(x), "rstd", "x without its last axis"));
  RETURN_IF_ERROR(ExpectChannelParam(in[3], x, "gamma"));
  return std::vector<TensorMeta>{in[1], in[3]};
}

// The CUDA kernels' partials of the parameter gradients (input 1 is x:
// rows of its last axis).
WorkspaceFn NormParamGradWorkspace(bool with_bias) {
  return [with_bias](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const AttrMap&,
                     DeviceType device) -> int64_t {
    if (in.size() < 2 || in[1].shape.rank() < 1) return 0;
    const int64_t C = in[1].shape[in[1].shape.rank() - 1];
    if (C == 0) return 0;
    const int64_t rows = in[1].shape.NumElements() / C;
    return device == DeviceType::kCuda ? NormParamGradWorkspaceBytes(rows, C, with_bias)
                                       : cpu::NormParamGradScratchBytes(rows, C, with_bias);
  };
}

void RegisterNorms(OpRegistry& r) {
  const TensorMeta x{DType::kF32, Shape{4, 6}};
  const TensorMeta channel{DType::kF32, Shape{6}};
  const TensorMeta stats{DType::kF32, Shape{4}};
  constexpr Role kRows = Role::kRows, kParam = Role::kParam;

  r.MustRegister(OpSchema("layer_norm")
                     .Doc("Layer normalisation over the last axis: y = (x - mean) * rstd * gamma + beta, rstd = 1 / "
                          "sqrt(var + eps) (biased variance); also outputs mean and rstd (x's shape without the last "
                          "axis) for the backward. Gradient: layer_norm_grad, for y only: mean and rstd are saved "
                          "statistics, and gradients arriving at them are ignored.")
                     .Input("x")
                     .Input("gamma")
                     .Input("beta")
                     .Output("y")
                     .Output("mean")
                     .Output("rstd")
                     .Attr("eps", AttrType::kFloat, 1e-5)
                     .Infer(InferLayerNorm)
                     .Sbp([=](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
                       return RowSplitSignatures(in[0].shape.rank(), {kRows, kParam, kParam}, {kRows, kRows, kRows});
                     })
                     .Grad([](GradBuilder& b) {
                       const std::vector<ValueId> g = b.Ops("layer_norm_grad", {b.OutputGradOrZeros(0), b.input(0),
                                                                                b.output(1), b.output(2), b.input(1)});
                       if (g.size() != 3) return;  // emission failed; the builder holds the error
                       b.SetInputGrad(0, g[0]);
                       b.SetInputGrad(1, g[1]);
                       b.SetInputGrad(2, g[2]);
                     })
                     .Kernel(DeviceType::kCpu, cpu::LayerNormKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::LayerNormKernel)
#endif
                     .Example({x, channel, channel}));
  // layer_norm_grad's signatures; with the addend, it laid out as dx.
  const auto layer_norm_grad_sbp = [=](bool with_addend) {
    return [=](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
      auto sigs = RowSplitSignatures(in[1].shape.rank(), {kRows, kRows, kRows, kRows, kParam}, {kRows, kParam, kParam});
      AddPartialDy(5, 3, sigs);
      if (with_addend) {
        for (SbpSignature& sig : sigs) sig.inputs.push_back(sig.outputs[0]);
      }
      return sigs;
    };
  };
  r.MustRegister(OpSchema("layer_norm_grad")
                     .Doc("Backward of layer_norm: (dy, x, mean, rstd, gamma) -> (dx, dgamma, dbeta).")
                     .Input("dy")
                     .Input("x")
                     .Input("mean")
                     .Input("rstd")
                     .Input("gamma")
                     .Output("dx")
                     .Output("dgamma")
                     .Output("dbeta")
                     .Infer(InferLayerNormGrad)
                     .Sbp(layer_norm_grad_sbp(/*with_addend=*/false))
                     .Workspace(NormParamGradWorkspace(/*with_bias=*/true))
                     .Kernel(DeviceType::kCpu, cpu::LayerNormGradKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::LayerNormGradKernel)
#endif
                     .Example({x, x, stats, stats, channel}));
  r.MustRegister(OpSchema("layer_norm_grad_add")
                     .Doc("layer_norm_grad with dx + addend in place of dx (addend x's shape, f32): the bits of "
                          "layer_norm_grad then add. What the engine makes of the residual stream's gradient sum "
                          "with a layer norm's input gradient.")
                     .Input("dy")
                     .Input("x")
                     .Input("mean")
                     .Input("rstd")
                     .Input("gamma")
                     .Input("addend")
                     .Output("dx")
                     .Output("dgamma")
                     .Output("dbeta")
                     .Infer([](const std::vector<TensorMeta>& in,
                               const AttrMap& attrs) -> absl::StatusOr<std::vector<TensorMeta>> {
                       ASSIGN_OR_RETURN(std::vector<TensorMeta> out,
                                        InferLayerNormGrad({in[0], in[1], in[2], in[3], in[4]}, attrs));
                       if (in[5] != out[0]) {
                         return absl::InvalidArgumentError(
                             StrCat("addend must be ", out[0].ToString(), " (dx's), got ", in[5].ToString()));
                       }
                       return out;
                     })
                     .Sbp(layer_norm_grad_sbp(/*with_addend=*/true))
                     .Workspace(NormParamGradWorkspace(/*with_bias=*/true))
                     .Kernel(DeviceType::kCpu, cpu::LayerNormGradKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::LayerNormGradKernel)
#endif
                     .Example({x, x, stats, stats, channel, x}));
  r.MustRegister(
      OpSchema("rms_norm")
          .Doc("RMS normalisation over the last axis: y = x * rstd * gamma, rstd = 1 / sqrt(mean(x²) + eps); "
               "also outputs rstd (x's shape without the last axis). Gradient: rms_norm_grad, for y only "
               "(gradients arriving at rstd are ignored).")
          .Input("x")
          .Input("gamma")
          .Output("y")
          .Output("rstd")
          .Attr("eps", AttrType::kFloat, 1e-5)
          .Infer(InferRmsNorm)
          .Sbp([=](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
            return RowSplitSignatures(in[0].shape.rank(), {kRows, kParam}, {kRows, kRows});
          })
          .Grad([](GradBuilder& b) {
            const std::vector<ValueId> g =
                b.Ops("rms_norm_grad", {b.OutputGradOrZeros(0), b.input(0), b.output(1), b.input(1)});
            if (g.size() != 2) return;  // emission failed; the builder holds the error
            b.SetInputGrad(0, g[0]);
            b.SetInputGrad(1, g[1]);
          })
          .Kernel(DeviceType::kCpu, cpu::RmsNormKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::RmsNormKernel)
#endif
          .Example({x, channel}));
  r.MustRegister(
      OpSchema("rms_norm_grad")
          .Doc("Backward of rms_norm: (dy, x, rstd, gamma) -> (dx, dgamma).")
          .Input("dy")
          .Input("x")
          .Input("rstd")
          .Input("gamma")
          .Output("dx")
          .Output("dgamma")
          .Infer(InferRmsNormGrad)
          .Sbp([=](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
            auto sigs = RowSplitSignatures(in[1].shape.rank(), {kRows, kRows, kRows, kParam}, {kRows, kParam});
            AddPartialDy(4, 2, sigs);
            return sigs;
          })
          .Workspace(NormParamGradWorkspace(/*with_bias=*/false))
          .Kernel(DeviceType::kCpu, cpu::RmsNormGradKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::RmsNormGradKernel)
#endif
          .Example({x, x, stats, channel}));
}

}  // namespace

void RegisterNormSoftmaxOps(OpRegistry& registry) {
  RegisterSoftmax(registry);
  RegisterFusedSoftmax(registry);
  RegisterNorms(registry);
}

}  // namespace tessera::ops
