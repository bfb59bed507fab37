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
// buffer (meta; none at momentum 0) and the learning rate (a scalar), which
// the initializer receives after the variable.
inline void SetSgdUpdate(PlanBuilder& b, uint64_t param, int64_t variable, int64_t gradient, const TensorMeta& meta,
                         double momentum) {
  // (Momentum 0 keeps no buffer: the states are the lr alone.)
  const bool buffered = momentum != 0;
  if (buffered) b.AddState(param, meta);
  b.AddState(param, TensorMeta{DType::kF32, Shape{}});
  b.AddInput(param, variable);
  b.AddInput(param, gradient);
  b.AddStateInput(param, 0);
  if (buffered) b.AddStateInput(param, 1);
  b.AddOutput(param, variable);
  if (buffered) b.AddStateOutput(param, 0);
  b.SetOp(param, "sgd_update", {{"momentum", momentum}});
}

// A training step without accumulation, as the scheduler lowers one:
// parameter w and source x feed d1 = w * x, d2 = d1 * d1, d3 = d2 + d2, the
// gradient of w's sgd_update (momentum 0.9); a sink watches w. The next
// iteration's d1 waits for the update, so d1 and d3 may share bytes while x
// (its source may run ahead) and d2 (read while d3 is written) may not.
struct TrainingLoop {
  uint64_t param = 0, src = 0, c1 = 0, c2 = 0, c3 = 0, watch = 0;
  int64_t w = 0, x = 0, d1 = 0, d2 = 0, d3 = 0;
};
// Quotas of x, d1, d2 and d3.
inline TrainingLoop AddTrainingLoop(PlanBuilder& b, const TensorMeta& meta, const std::vector<int32_t>& quotas) {
  TrainingLoop t;
  t.param = b.AddTask(proto::ACTOR_KIND_PARAMETER, "w");
  t.src = b.AddTask(proto::ACTOR_KIND_SOURCE, "x");
  t.c1 = b.AddTask(proto::ACTOR_KIND_COMPUTE, "c1");
  t.c2 = b.AddTask(proto::ACTOR_KIND_COMPUTE, "c2");
  t.c3 = b.AddTask(proto::ACTOR_KIND_COMPUTE, "c3");
  t.watch = b.AddTask(proto::ACTOR_KIND_SINK, "watch");
  t.w = b.AddRegisterDesc(t.param, {t.c1, t.watch}, 1, {meta});
  t.x = b.AddRegisterDesc(t.src, {t.c1}, quotas.at(0), {meta});
  t.d1 = b.AddRegisterDesc(t.c1, {t.c2}, quotas.at(1), {meta});
  t.d2 = b.AddRegisterDesc(t.c2, {t.c3}, quotas.at(2), {meta});
  t.d3 = b.AddRegisterDesc(t.c3, {t.param}, quotas.at(3), {meta});
  SetCompute(b, t.c1, "mul", {{t.w, 0}, {t.x, 0}}, t.d1);
  SetCompute(b, t.c2, "mul", {{t.d1, 0}, {t.d1, 0}}, t.d2);
  SetCompute(b, t.c3, "add", {{t.d2, 0}, {t.d2, 0}}, t.d3);
  SetSgdUpdate(b, t.param, t.w, t.d3, meta, /*momentum=*/0.9);
  b.task(t.param).set_callback("w");
  return t;
}

}  // namespace tessera::actors::testing
