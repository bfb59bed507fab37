#pragma once
// A sequential interpreter of physical plans — a TEST ORACLE for the actor
// runtime, never used by the engine. It runs the same plan (serialised
// bytes, as the runtime receives them) with the same host callbacks and the
// same kernels, but with no actors, messages or quotas: one register per
// desc, tasks in a topological order, piece by piece:
//
//   for each iteration:
//     1. the once-per-iteration tasks that do not depend on an acc
//        (sources such as the learning rate, parameters, constants...);
//     2. for each micro-batch k: the per-micro-batch tasks (sources, repeat
//        views, compute) in topological order, and each acc adds piece k;
//     3. the once-per-iteration tasks downstream of an acc (the scaled
//        gradients, clipping, the sink);
//     4. every parameter's update op, in place.
//
// Not thread-safe; runs on the caller's thread.

#include <string_view>

#include "absl/status/status.h"
#include "actors/runtime.h"

namespace tessera::actors::testing {

absl::Status RunPlanSequentially(std::string_view plan_bytes, const RuntimeOptions& options);

}  // namespace tessera::actors::testing
