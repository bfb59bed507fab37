#pragma once
// Lowering a logical graph (after Autodiff / ApplyOptimizer /
// EliminateDeadCode) to a physical plan for ONE device (DESIGN §7):
//   - a Source task per graph input that ops read, filled by the host
//     callback "input:<name>" every iteration (quota options.source_quota);
//   - a Parameter task per variable, initialised by callback
//     "init:<name>"; the optimizer update node of a variable (an op whose
//     output 0 is the variable's update and whose other outputs update state
//     variables it reads) runs inside that task, the state variables becoming
//     the task's state tensors;
//   - a Compute task per remaining op node, producing one register desc that
//     holds all its outputs;
//   - a Parameter task without update per constant op (no inputs), filled
//     once by callback "const:<node id>";
//   - one Sink task (callback "fetch") reading the loss(es) and fetches.
// Every task sits on (node 0, cpu:device_index, compute stream 0).
// Not done: gradient accumulation (repeat / acc nodes are rejected), more
// than one device, collectives.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"
#include "graph/graph.h"

namespace tessera::scheduler {

inline constexpr uint32_t kComputeStream = 0;
inline constexpr char kSinkCallback[] = "fetch";

struct LowerOptions {
  int64_t iterations = 1;
  int32_t default_quota = 1;
  int32_t source_quota = 2;
  uint32_t device_index = 0;
};

struct LoweredPlan {
  proto::Plan plan;  // with its memory estimate
  // Source callback name -> graph input value.
  std::map<std::string, graph::ValueId> sources;
  // Initializer callback name -> the variable followed by its state variables
  // (the order of the tensors the callback receives).
  std::map<std::string, std::vector<graph::ValueId>> initializers;
  // Initializer callback name of a constant (an op without inputs, e.g. the
  // autodiff seed) -> its node; the callback receives the node's outputs.
  std::map<std::string, graph::NodeId> constants;
  // Names of the tensors the sink callback receives, in order: "loss" (or
  // "loss<i>" for i > 0) and the fetch names; "" for tensors of the consumed
  // registers that are neither.
  std::vector<std::string> sink_names;
};

absl::StatusOr<LoweredPlan> LowerToPlan(const graph::Graph& graph, const LowerOptions& options = {});

}  // namespace tessera::scheduler
