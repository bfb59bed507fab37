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

namespace tessera::ops {

namespace cpu {
absl::Status SgdUpdateKernel(KernelContext& ctx);
absl::Status AdamwUpdateKernel(KernelContext& ctx);
}  // namespace cpu

namespace {

// in = (param, state..., lr): every tensor but lr must be f32 of param's shape;
// lr a one-element f32 tensor.
absl::Status CheckUpdateInputs(const std::vector<TensorMeta>& in, const std::vector<std::string>& names) {
  for (size_t i = 0; i + 1 < in.size(); ++i) {
    RETURN_IF_ERROR(ExpectDType(in[i], DType::kF32, names[i]));
    if (in[i].shape != in[0].shape) {
      return absl::InvalidArgumentError(StrCat("'", names[i], "' must have the shape of '", names[0], "' ",
                                               in[0].shape.ToString(), ", got ", in[i].shape.ToString()));
    }
  }
  const TensorMeta& lr = in.back();
  RETURN_IF_ERROR(ExpectDType(lr, DType::kF32, "lr"));
  if (lr.shape.NumElements() != 1) {
    return absl::InvalidArgumentError(StrCat("'lr' must hold one element, got shape ", lr.shape.ToString()));
  }
  return absl::OkStatus();
}

// Parameter and state split alike along any axis (lr broadcast), or all
// broadcast.
std::vector<SbpSignature> UpdateSignatures(const std::vector<TensorMeta>& in, int num_outputs) {
  const size_t tensors = in.size() - 1;
  std::vector<SbpSignature> sigs;
  for (int axis = 0; axis < in[0].shape.rank(); ++axis) {
    std::vector<Sbp> inputs(tensors, Sbp::Split(axis));
    inputs.push_back(Sbp::Broadcast());
    sigs.push_back({std::move(inputs), std::vector<Sbp>(static_cast<size_t>(num_outputs), Sbp::Split(axis))});
  }
  sigs.push_back({std::vector<Sbp>(in.size(), Sbp::Broadcast()),
                  std::vector<Sbp>(static_cast<size_t>(num_outputs), Sbp::Broadcast())});
  return sigs;
}

absl::StatusOr<std::vector<TensorMeta>> InferSgd(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(CheckUpdateInputs(in, {"param", "grad", "momentum_buf"}));
  const double momentum = attrs.Float("momentum"), weight_decay = attrs.Float("weight_decay");
  if (!(momentum >= 0) || !(weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        StrCat("momentum and weight_decay must be >= 0, got ", momentum, " and ", weight_decay));
  }
  if (attrs.Bool("nesterov") && momentum == 0) {
    return absl::InvalidArgumentError("nesterov momentum needs momentum > 0");
  }
  return std::vector<TensorMeta>{in[0], in[0]};
}

absl::StatusOr<std::vector<TensorMeta>> InferAdamw(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(CheckUpdateInputs(in, {"param", "grad", "m", "v"}));
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
               "Outputs may alias inputs.")
          .Input("param")
          .Input("grad")
          .Input("momentum_buf")
          .Input("lr")
          .Output("new_param")
          .Output("new_momentum_buf")
          .Attr("momentum", AttrType::kFloat, 0.0)
          .Attr("weight_decay", AttrType::kFloat, 0.0)
          .Attr("nesterov", AttrType::kBool, false)
          .Infer(InferSgd)
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) { return UpdateSignatures(in, 2); })
          .Kernel(DeviceType::kCpu, cpu::SgdUpdateKernel)
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
               "bias_correction is false). Outputs may alias inputs.")
          .Input("param")
          .Input("grad")
          .Input("m")
          .Input("v")
          .Input("lr")
          .Output("new_param")
          .Output("new_m")
          .Output("new_v")
          .Attr("beta1", AttrType::kFloat, 0.9)
          .Attr("beta2", AttrType::kFloat, 0.999)
          .Attr("eps", AttrType::kFloat, 1e-8)
          .Attr("weight_decay", AttrType::kFloat, 0.01)
          .Attr("bias_correction", AttrType::kBool, true)
          .Infer(InferAdamw)
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) { return UpdateSignatures(in, 3); })
          .Kernel(DeviceType::kCpu, cpu::AdamwUpdateKernel)
          .Example({{DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{4, 6}},
                    {DType::kF32, Shape{}}}));
}

}  // namespace tessera::ops
