#pragma once
// Init rules (proto::InitRule): how a Parameter task fills its variable and
// state tensors from the plan alone, so that a worker needs nothing but its
// bytes (DESIGN §9). Each rule runs an op without inputs (an init op such as
// `normal`, or a constant op) on the task's shards: the kernel sees each
// output's slice of the logical tensor, and random ops draw by global element
// index, so every layout starts from the same numbers.

#include <vector>

#include "absl/status/status.h"
#include "comm/proto/plan.pb.h"
#include "core/tensor.h"
#include "ops/registry.h"

namespace tessera::actors {

// Checks `task`'s rules against the metas of the tensors they fill (the
// variable's, then the state's, in order): every op exists and takes no
// inputs, the rules write exactly `tensors.size()` tensors, and each slice
// places a tensor of that dtype and local shape inside the op's logical
// output. Errors name the task's rule and the mismatch.
absl::Status ValidateInitRules(const proto::Task& task, const ops::OpRegistry& registry,
                               const std::vector<TensorMeta>& tensors);

// Runs the rules into `tensors` (validated: ValidateInitRules).
absl::Status RunInitRules(const proto::Task& task, const ops::OpRegistry& registry,
                          const std::vector<Tensor>& tensors);

}  // namespace tessera::actors
