#pragma once
// What the lowering knows about a graph before it emits any task: how often
// each value is produced under gradient accumulation, which op updates which
// variable (and its optimizer state), what the sink reads, which values
// backward keeps. Internal to scheduler/: LowerToPlan builds these with the
// functions below and hands them to the Lowering (scheduler/lowering/lowering.h),
// which only reads them. Plain values; no thread-safety concerns.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/sbp.h"
#include "graph/graph.h"

namespace tessera::scheduler::lowering {

// How often a value is produced under gradient accumulation.
enum class Rate : uint8_t { kUnknown, kIteration, kMicroBatch };
struct Rates {
  int64_t num_micro_batches = 1;  // m, from the repeat / acc nodes
  std::vector<Rate> value;        // per ValueId
};

// Every value's rate: variables, the learning rate and what follows an acc
// run once per iteration; data inputs and what lies between repeat and acc
// once per micro-batch. Errors: repeat / acc nodes disagreeing on m, an op
// reading values of two rates, a constant read at both rates.
absl::StatusOr<Rates> InferRates(const graph::Graph& graph);

struct GraphFacts {
  Rates rates;
  // Optimizer updates: the op node that updates a variable in place (its
  // output 0 is the variable's update) -> that variable.
  std::map<graph::NodeId, graph::ValueId> update_owner;
  // An optimizer state variable (updated by output k > 0 of its owner's
  // update node) -> (owning variable, state index k - 1), and the reverse.
  std::map<graph::ValueId, std::pair<graph::ValueId, int32_t>> state_of;
  std::map<graph::ValueId, std::vector<std::pair<graph::ValueId, int32_t>>> states_of_owner;
  // Per value under gradient accumulation: how the iteration's tensor is
  // laid out over the micro-batches (nullopt: unknown; see graph_facts.cc).
  std::vector<std::optional<Sbp>> micro_layout;
  // What the sink reads, in order: ("loss" / "loss<i>", value), then the fetches.
  std::vector<std::pair<std::string, graph::ValueId>> sinks;
  // Values some task or the sink reads (tasks exist only for those).
  std::set<graph::ValueId> read;
  // Forward values that backward (autodiff's) nodes read.
  std::set<graph::ValueId> kept_for_backward;
  // Per value, for the coordinator's launch order: the number of accs
  // upstream, and whether it is computed from gradients.
  std::vector<int32_t> epoch;
  std::vector<bool> backward;
};

// The facts of `graph` given its rates (moved into the result). Errors: an
// update that is not an in-place op output, optimizer state read outside its
// update or fetched, a loss or fetch computed once per micro-batch.
absl::StatusOr<GraphFacts> CollectGraphFacts(const graph::Graph& graph, Rates rates);

}  // namespace tessera::scheduler::lowering
