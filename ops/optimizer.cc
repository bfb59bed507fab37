// Optimizer updates: sgd_update and adamw_update, with PyTorch's semantics
// (torch.optim.SGD without dampening, torch.optim.AdamW).
//
// Each op maps (parameter, gradient, state..., lr) to (new parameter, new
// state...) element by element. The learning rate is a scalar tensor so a
// schedule can feed a new value every iteration without re-planning. The
// outputs may alias the inputs (the runtime updates parameters in place): the
// kernels read all of an element's inputs before writing its outputs.

#include <cmath>

#include "core/text.h"
#include "ops/op_util.h"
#include "ops/registry.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/optimizer.h"
#endif

namespace tessera::ops {

namespace cpu {
absl::Status SgdUpdateKernel(KernelContext& ctx);
absl::Status AdamwUpdateKernel(KernelContext& ctx);
absl::Status NonfiniteKernel(KernelContext& ctx);
absl::Status LossScaleUpdateKernel(KernelContext& ctx);
}  // namespace cpu

namespace {

// in = (param, state..., lr[, skip[, skipped]]): the tensors `names` f32
// of param's shape; lr, skip and skipped one-element f32 tensors, at most
// `scalars` of them.
absl::Status CheckUpdateInputs(const std::vector<TensorMeta>& in, const std::vector<std::string>& names,
                               size_t scalars) {
  if (in.size() < names.size() + 1 || in.size() > names.size() + scalars) {
    return absl::InvalidArgumentError(StrCat("expects ", names.size(), " tensors, lr and optionally ",
                                             scalars == 2 ? "skip" : "skip and skipped", ", got ", in.size(),
                                             " inputs"));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    RETURN_IF_ERROR(ExpectDType(in[i], DType::kF32, names[i]));
    if (in[i].shape != in[0].shape) {
      return absl::InvalidArgumentError(StrCat("'", names[i], "' must have the shape of '", names[0], "' ",
                                               in[0].shape.ToString(), ", got ", in[i].shape.ToString()));
    }
  }
  for (size_t i = names.size(); i < in.size(); ++i) {
    const char* const scalar_names[] = {"lr", "skip", "skipped"};
    const std::string name = scalar_names[i - names.size()];
    RETURN_IF_ERROR(ExpectDType(in[i], DType::kF32, name));
    if (in[i].shape.NumElements() != 1) {
      return absl::InvalidArgumentError(
          StrCat("'", name, "' must hold one element, got shape ", in[i].shape.ToString()));
    }
  }
  return absl::OkStatus();
}

// Parameter and state split alike along any axis (lr and skip broadcast),
// or all broadcast.
std::vector<SbpSignature> UpdateSignatures(const std::vector<TensorMeta>& in, int num_outputs, size_t tensors) {
  std::vector<SbpSignature> sigs;
  for (int axis = 0; axis < in[0].shape.rank(); ++axis) {
    std::vector<Sbp> inputs(tensors, Sbp::Split(axis));
    inputs.resize(in.size(), Sbp::Broadcast());
    sigs.push_back({std::move(inputs), std::vector<Sbp>(static_cast<size_t>(num_outputs), Sbp::Split(axis))});
  }
  sigs.push_back({std::vector<Sbp>(in.size(), Sbp::Broadcast()),
                  std::vector<Sbp>(static_cast<size_t>(num_outputs), Sbp::Broadcast())});
  return sigs;
}

// SGD keeps a momentum buffer only at momentum > 0 (as torch.optim.SGD).
bool SgdBuffered(const AttrMap& attrs) { return attrs.Float("momentum") != 0; }

absl::StatusOr<std::vector<TensorMeta>> InferSgd(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  const double momentum = attrs.Float("momentum"), weight_decay = attrs.Float("weight_decay");
  if (!(momentum >= 0) || !(weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        StrCat("momentum and weight_decay must be >= 0, got ", momentum, " and ", weight_decay));
  }
  if (attrs.Bool("nesterov") && momentum == 0) {
    return absl::InvalidArgumentError("nesterov momentum needs momentum > 0");
  }
  if (SgdBuffered(attrs)) {
    RETURN_IF_ERROR(CheckUpdateInputs(in, {"param", "grad", "momentum_buf"}, 2));
    return std::vector<TensorMeta>{in[0], in[0]};
  }
  RETURN_IF_ERROR(CheckUpdateInputs(in, {"param", "grad"}, 2));
  return std::vector<TensorMeta>{in[0]};
}

absl::StatusOr<std::vector<TensorMeta>> InferAdamw(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(CheckUpdateInputs(in, {"param", "grad", "m", "v"}, 3));
  const double beta1 = attrs.Float("beta1"), beta2 = attrs.Float("beta2");
  const double eps = attrs.Float("eps"), weight_decay = attrs.Float("weight_decay");
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
    return absl::InvalidArgumentError(StrCat("beta1 and beta2 must be in [0, 1), got ", beta1, " and ", beta2));
  }
  if (!(eps >= 0) || !(weight_decay >= 0)) {
    return absl::InvalidArgumentError(StrCat("eps and weight_decay must be >= 0, got ", eps, " and ", weight_decay));
  }
  return std::vector<TensorMeta>{in[0], in[0], in[0]};
}

}  // namespace

void RegisterOptimizerOps(OpRegistry& registry) {
  registry.MustRegister(
      OpSchema("sgd_update")
          .Doc("SGD step as torch.optim.SGD (no dampening): g' = grad + weight_decay * param; "
               "buf' = momentum * buf + g'; param' = param - lr * (nesterov ? g' + momentum * buf' : buf'). "
               "Inputs: param, grad, momentum_buf (only at momentum > 0: momentum 0 keeps no buffer, and has no "
               "new_momentum_buf output), lr and optionally skip (one element: nonzero leaves param and buf as "
               "they were, a step skipped for a gradient overflow). Outputs may alias inputs.")
          .Input("param")
          .Input("grad")
          .VariadicInput("momentum_buf_lr_skip")
          .Output("new_param")
          .VariadicOutput("new_momentum_buf")
          .Attr("momentum", AttrType::kFloat, 0.0)
          .Attr("weight_decay", AttrType::kFloat, 0.0)
          .Attr("nesterov", AttrType::kBool, false)
          .Infer(InferSgd)
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap& attrs, int64_t) {
            return SgdBuffered(attrs) ? UpdateSignatures(in, 2, 3) : UpdateSignatures(in, 1, 2);
          })
          .Kernel(DeviceType::kCpu, cpu::SgdUpdateKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::SgdUpdateKernel)
#endif
          .Example({{DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{}}},
                   {{"momentum", 0.9}}));

  registry.MustRegister(
      OpSchema("adamw_update")
          .Doc("AdamW step as torch.optim.AdamW, with t = step + 1: param' = param * (1 - lr * weight_decay); "
               "m' = beta1 m + (1 - beta1) grad; v' = beta2 v + (1 - beta2) grad^2; "
               "param' -= lr * m'/(1 - beta1^t) / (sqrt(v'/(1 - beta2^t)) + eps) (no bias correction when "
               "bias_correction is false). Inputs end with lr and optionally skip (one element: nonzero leaves "
               "param, m and v as they were) and skipped (one element: the steps skipped before this one, which t "
               "does not count, as torch counts only the steps taken). Outputs may alias inputs.")
          .Input("param")
          .Input("grad")
          .Input("m")
          .Input("v")
          .VariadicInput("lr")
          .Output("new_param")
          .Output("new_m")
          .Output("new_v")
          .Attr("beta1", AttrType::kFloat, 0.9)
          .Attr("beta2", AttrType::kFloat, 0.999)
          .Attr("eps", AttrType::kFloat, 1e-8)
          .Attr("weight_decay", AttrType::kFloat, 0.01)
          .Attr("bias_correction", AttrType::kBool, true)
          .Infer(InferAdamw)
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) { return UpdateSignatures(in, 3, 4); })
          .Kernel(DeviceType::kCpu, cpu::AdamwUpdateKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::AdamwUpdateKernel)
#endif
          .Example({{DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{}}}));

  registry.MustRegister(
      OpSchema("nonfinite")
          .Doc("y = 1 if any element of x is NaN or infinite, else 0 (an f32 scalar): mixed precision's overflow "
               "check")
          .NonDifferentiableInput("x")
          .Output("y")
          .Infer([](const std::vector<TensorMeta>& in, const AttrMap&) -> absl::StatusOr<std::vector<TensorMeta>> {
            if (in[0].dtype != DType::kF32 && in[0].dtype != DType::kBF16 && in[0].dtype != DType::kF16) {
              return absl::InvalidArgumentError(StrCat("'x' must be a float, got ", DTypeName(in[0].dtype)));
            }
            return std::vector<TensorMeta>{{DType::kF32, Shape{}}};
          })
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
            // A shard's flag is the flag of its elements: the max over shards.
            std::vector<SbpSignature> sigs;
            for (int axis = 0; axis < in[0].shape.rank(); ++axis) {
              sigs.push_back({{Sbp::Split(axis)}, {Sbp::PartialMax()}});
            }
            sigs.push_back({{Sbp::Broadcast()}, {Sbp::Broadcast()}});
            return sigs;
          })
          .Kernel(DeviceType::kCpu, cpu::NonfiniteKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::NonfiniteKernel)
#endif
          .Example({{DType::kF32, Shape{4, 6}}}));

  registry.MustRegister(
      OpSchema("loss_scale_update")
          .Doc("Dynamic loss scaling as torch.cuda.amp.GradScaler: with found_inf nonzero, scale' = scale * "
               "backoff and good_steps' = 0; else good_steps' = good_steps + 1 and, when that reaches "
               "growth_interval, scale' = scale * growth and good_steps' = 0. Outputs may alias inputs.")
          .NonDifferentiableInput("scale")
          .NonDifferentiableInput("found_inf")
          .NonDifferentiableInput("good_steps")
          .Output("new_scale")
          .Output("new_good_steps")
          .Attr("backoff", AttrType::kFloat, 0.5)
          .Attr("growth", AttrType::kFloat, 2.0)
          .Attr("growth_interval", AttrType::kInt, int64_t{2000})
          .Infer([](const std::vector<TensorMeta>& in,
                    const AttrMap& attrs) -> absl::StatusOr<std::vector<TensorMeta>> {
            for (size_t i = 0; i < in.size(); ++i) {
              const char* name = i == 0 ? "scale" : i == 1 ? "found_inf" : "good_steps";
              RETURN_IF_ERROR(ExpectDType(in[i], DType::kF32, name));
              if (in[i].shape.NumElements() != 1) {
                return absl::InvalidArgumentError(
                    StrCat("'", name, "' must hold one element, got shape ", in[i].shape.ToString()));
              }
            }
            const double backoff = attrs.Float("backoff"), growth = attrs.Float("growth");
            if (!(backoff > 0 && backoff < 1) || !(growth > 1) || attrs.Int("growth_interval") < 1) {
              return absl::InvalidArgumentError(StrCat("backoff must be in (0, 1), growth > 1 and growth_interval >= "
                                                       "1, got ", backoff, ", ", growth, " and ",
                                                       attrs.Int("growth_interval")));
            }
            return std::vector<TensorMeta>{in[0], in[2]};
          })
          .Sbp([](const std::vector<TensorMeta>&, const AttrMap&, int64_t) {
            return std::vector<SbpSignature>{{{Sbp::Broadcast(), Sbp::Broadcast(), Sbp::Broadcast()},
                                              {Sbp::Broadcast(), Sbp::Broadcast()}}};
          })
          .Kernel(DeviceType::kCpu, cpu::LossScaleUpdateKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::LossScaleUpdateKernel)
#endif
          .Example({{DType::kF32, Shape{}}, {DType::kF32, Shape{}}, {DType::kF32, Shape{}}}));
}

}  // namespace tessera::ops
