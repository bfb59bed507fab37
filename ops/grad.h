#pragma once
// Gradient rules emit backward *ops* (never run kernels): a rule receives the
// forward op's inputs, outputs and the gradients of its outputs as opaque
// value ids and emits ops through a GradEmitter. graph/ implements the
// emitter symbolically (autodiff); EagerGradEmitter (ops/eager.h) runs each
// emitted op at once, which is how the finite-difference checks test rules.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "ops/attr.h"

namespace tessera::ops {

using ValueId = int64_t;
inline constexpr ValueId kNoValue = -1;

class GradEmitter {
 public:
  virtual ~GradEmitter() = default;
  // Adds op(inputs; attrs) and returns the ids of its outputs, or an error
  // (unknown op, bad attributes, shape mismatch) naming the op.
  virtual absl::StatusOr<std::vector<ValueId>> Emit(std::string_view op, const std::vector<ValueId>& inputs,
                                                    const AttrMap& attrs) = 0;
  virtual TensorMeta Meta(ValueId value) const = 0;
};

// The view of one forward op that a gradient rule works with. Emission errors
// are sticky: after the first one every Op() returns kNoValue and status()
// holds the error, so rules read straight through without error plumbing.
class GradBuilder {
 public:
  GradBuilder(GradEmitter& emitter, std::string op_name, std::vector<ValueId> inputs,
              std::vector<ValueId> outputs, std::vector<ValueId> output_grads, const AttrMap& attrs);

  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  ValueId input(int i) const { return inputs_[static_cast<size_t>(i)]; }
  ValueId output(int i) const { return outputs_[static_cast<size_t>(i)]; }
  // kNoValue when nothing downstream needs this output's gradient.
  ValueId output_grad(int i) const { return output_grads_[static_cast<size_t>(i)]; }
  bool has_output_grad(int i) const { return output_grad(i) != kNoValue; }
  // The output's gradient, or zeros of its shape when there is none.
  ValueId OutputGradOrZeros(int i);
  const AttrMap& attrs() const { return attrs_; }
  TensorMeta meta(ValueId value) const;

  // Emits one op and returns its first output.
  ValueId Op(std::string_view op, const std::vector<ValueId>& inputs, const AttrMap& attrs = {});
  // Emits one op and returns all its outputs.
  std::vector<ValueId> Ops(std::string_view op, const std::vector<ValueId>& inputs, const AttrMap& attrs = {});
  // Sums a broadcast gradient back to `shape` (numpy broadcasting rules).
  ValueId SumToShape(ValueId grad, const Shape& shape);

  void SetInputGrad(int i, ValueId grad) { input_grads_[static_cast<size_t>(i)] = grad; }
  const std::vector<ValueId>& input_grads() const { return input_grads_; }
  const absl::Status& status() const { return status_; }

 private:
  GradEmitter& emitter_;
  std::string op_name_;
  std::vector<ValueId> inputs_, outputs_, output_grads_;
  const AttrMap& attrs_;
  std::vector<ValueId> input_grads_;
  absl::Status status_;
};

}  // namespace tessera::ops
