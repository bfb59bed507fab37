#pragma once
// Building blocks of the hand-written plans of the actor tests.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actors/plan.h"
#include "core/tensor.h"

namespace tessera::actors::testing {

// Makes `task` run `op` on (desc, tensor index) inputs, writing tensor 0 of
// `output`.
inline void SetCompute(PlanBuilder& b, uint64_t task, const std::string& op,
                       const std::vector<std::pair<int64_t, int32_t>>& inputs, int64_t output) {
  for (const auto& [desc, tensor] : inputs) b.AddInput(task, desc, tensor);
  b.AddOutput(task, output);
  b.SetOp(task, op);
}

// Makes parameter `param` (variable desc `variable`, tensors of `meta`) apply
// sgd_update with the gradient desc `gradient`. Its state: the momentum
// buffer (meta) and the learning rate (a scalar), which the initializer
// receives after the variable.
inline void SetSgdUpdate(PlanBuilder& b, uint64_t param, int64_t variable, int64_t gradient, const TensorMeta& meta,
                         double momentum) {
  b.AddState(param, meta);
  b.AddState(param, TensorMeta{DType::kF32, Shape{}});
  b.AddInput(param, variable);
  b.AddInput(param, gradient);
  b.AddStateInput(param, 0);
  b.AddStateInput(param, 1);
  b.AddOutput(param, variable);
  b.AddStateOutput(param, 0);
  b.SetOp(param, "sgd_update", {{"momentum", momentum}});
}

}  // namespace tessera::actors::testing
