#include "ops/grad.h"

#include "core/text.h"

namespace tessera::ops {

GradBuilder::GradBuilder(GradEmitter& emitter, std::string op_name, std::vector<ValueId> inputs,
                         std::vector<ValueId> outputs, std::vector<ValueId> output_grads, const AttrMap& attrs)
    : emitter_(emitter),
      op_name_(std::move(op_name)),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      output_grads_(std::move(output_grads)),
      attrs_(attrs),
      input_grads_(inputs_.size(), kNoValue) {}

TensorMeta GradBuilder::meta(ValueId value) const { return emitter_.Meta(value); }

std::vector<ValueId> GradBuilder::Ops(std::string_view op, const std::vector<ValueId>& inputs,
                                      const AttrMap& attrs) {
  if (!status_.ok()) return {kNoValue};
  for (ValueId v : inputs) {
    if (v == kNoValue) {
      status_ = absl::InternalError(StrCat("gradient of '", op_name_, "': emits '", op, "' on a missing value"));
      return {kNoValue};
    }
  }
  auto result = emitter_.Emit(op, inputs, attrs);
  if (!result.ok()) {
    status_ = absl::Status(result.status().code(),
                           StrCat("gradient of '", op_name_, "': ", result.status().message()));
    return {kNoValue};
  }
  return *std::move(result);
}

ValueId GradBuilder::Op(std::string_view op, const std::vector<ValueId>& inputs, const AttrMap& attrs) {
  return Ops(op, inputs, attrs).front();
}

ValueId GradBuilder::OutputGradOrZeros(int i) {
  if (has_output_grad(i)) return output_grad(i);
  const TensorMeta m = meta(output(i));
  return Op("zeros", {}, {{"shape", m.shape.dims()}, {"dtype", m.dtype}});
}

ValueId GradBuilder::SumToShape(ValueId grad, const Shape& shape) {
  if (!status_.ok()) return kNoValue;
  const Shape from = meta(grad).shape;
  if (from == shape) return grad;
  // Sum over leading axes the target lacks and over axes where it has 1.
  std::vector<int64_t> axes;
  const int lead = from.rank() - shape.rank();
  for (int i = 0; i < from.rank(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && from[i] != 1)) axes.push_back(i);
  }
  ValueId summed = axes.empty() ? grad : Op("reduce_sum", {grad}, {{"axes", axes}, {"keepdim", false}});
  return Op("reshape", {summed}, {{"shape", shape.dims()}});
}

}  // namespace tessera::ops
