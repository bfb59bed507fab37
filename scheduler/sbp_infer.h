#pragma once
// SBP inference (DESIGN §7): for a logical graph and a DeviceMesh, the
// pipeline stage and the N-D SBP layout of every value, the N-D signature of
// every op, and the boxing edges (conversions) the plan will need.
//
// Layouts are NdSbp over a stage's 2-D hierarchy [dp, tp] (axis 0 data
// parallel, axis 1 tensor parallel; scheduler/mesh.h). On an axis of size 1
// every entry is B (canonical form): a hint (S(0), B) on a mesh with dp = 1
// means (B, B).
//
// Stages. A node with a layer_idx runs on DeviceMesh::StageOfLayer(layer_idx)
// (0.. by LiBai's balancing rule, -1 = the last stage; backward and optimizer
// nodes carry their forward node's layer_idx). A node whose layer_idx is
// graph::kUnassignedLayer and that has inputs runs on the latest stage among
// its inputs' stages (a loss after the head follows the head); one without
// inputs, or whose inputs are all unassigned, on the earliest stage among its
// consumers (stage 0 when it has none).
// Value::placement_hint is not supported yet (an error): stages come from
// layer_idx only, and every value lives on the job's devices.
//
// Layouts.
//   - Graph inputs: their sbp_hint, else options.default_input ((S(0), B):
//     the batch split over data parallel; S(0) of a scalar becomes B).
//   - Variables: their sbp_hint; else, for an optimizer state variable (one
//     updated by output k > 0 of the op whose output 0 updates variable w),
//     w's layout; else options.default_variable ((B, B)).
//   - repeat / acc: their input's layout passes through (acc of a P value
//     stays P), unless the output is hinted (then the input is boxed to it).
//   - Ops, in node order (a topological order): the N-D candidates are the
//     product over hierarchy axes of ops::OpSchema::SbpSignatures(inputs,
//     attrs, axis size) (all-B on an axis of size 1, and when the op declares
//     none). A candidate is allowed when each output with an sbp_hint gets
//     exactly that layout and each output that is a variable update
//     (Graph::variable_updates) gets exactly the variable's layout. Among the
//     allowed ones the op takes the cheapest (sum of the BoxingCost over its
//     inputs, from the producers' layouts; an input layout an earlier
//     consumer already converts the value to costs nothing, since the
//     lowering converts each value to each layout once — so a clipped
//     gradient reuses the reduction its norm needed instead of reducing twice).
//   TIE-BREAK (deterministic), in this order: lower cost (equal within a
//   relative 1e-9); fewer P / P(max) entries over all outputs (keep results
//   split or broadcast rather than partial: S→P costs 0, so matmul(S(0), B)
//   would otherwise tie with P x B -> P); fewer input entries that need any
//   conversion, even a free one (keep the producers' layouts: gelu of a B
//   input stays B instead of slicing to S(0) and needing an all-gather
//   later); fewer split output entries (B over S when nothing else decides,
//   e.g. for ops without inputs: a B result never needs communication
//   later); the earlier candidate in declaration order (axis-0 signature
//   index, then axis-1).
//   When no candidate is allowed the error names the op, its node id and
//   scope, each constraint (hint or variable layout) and the nearest valid
//   signatures (fewest constrained entries differing).
//   - Losses and fetches are read by the host sink as options.sink ((B, B))
//     on the last stage: a required consumer layout like any other.
//
// Edges are per consumer: a value read by two consumers in the same layout
// (e.g. an activation sent to the next stage for forward and for the weight
// gradient) gives two identical edges, each with its BoxingCost; the
// lowering shares one conversion between them.
//
// Costs: BoxingCost of core/boxing_cost.h (bytes each rank sends, DESIGN
// §7; an nd-SBP conversion costs the route boxing takes; across placements,
// i.e. different stages, T whatever the layouts), the same model boxing
// (comm/collective/boxing.h) picks its routes by.
//
// Greedy per op, as OneFlow's: no look-ahead. Not done: auto-parallel search,
// placement hints, compute/memory terms in the cost.
// Stateless functions; safe to call from any thread on a const graph.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/sbp.h"
#include "core/tensor.h"
#include "graph/graph.h"
#include "ops/op_schema.h"
#include "scheduler/mesh.h"

namespace tessera::scheduler {

// A placement's mesh shape, e.g. {2, 4}.
using Hierarchy = std::vector<int64_t>;

struct SbpInferOptions {
  NdSbp default_input = {Sbp::Split(0), Sbp::Broadcast()};
  NdSbp default_variable = {Sbp::Broadcast(), Sbp::Broadcast()};
  NdSbp sink = {Sbp::Broadcast(), Sbp::Broadcast()};
  // ZeRO (DESIGN §6), 0 = off. From stage 1 on, every trained variable and
  // its optimizer state are laid out S(k) over the data-parallel axis (k its
  // first axis of at least dp elements that no other axis splits; a
  // variable with none stays as it was): the update runs on the shard, its
  // gradient arrives reduce-scattered, and every other reader gets the
  // variable in its unsharded layout. Stages 1 and 2 gather it once per
  // iteration (before the micro-batches' repeat); stage 2 also keeps the
  // gradient accumulator sharded (each micro-batch's gradient
  // reduce-scattered into it); stage 3 gathers it per micro-batch for each
  // reader (graph::GatherPerReader gives each reader its own copy, made when
  // the reader's other input exists) and frees it after that reader. A
  // graph with no updates (evaluation) shards its trainable variables
  // alike, so that its plan reads the training plan's shards.
  int zero_stage = 0;
};

// Where and how a value lives: a pipeline stage (its placement is
// DeviceMesh::stage_placement(stage)) and an NdSbp over that placement.
struct ValueLayout {
  int64_t stage = 0;
  NdSbp nd_sbp;
  std::string ToString() const;  // "stage 1 (S(0), B)"
  bool operator==(const ValueLayout&) const = default;
};

struct NodeLayout {
  int64_t stage = 0;
  // One 1-D signature per hierarchy axis. Variables and inputs: no inputs,
  // the output's entry; repeat / acc: the pass-through X -> X.
  std::vector<ops::SbpSignature> signatures;
  std::vector<NdSbp> inputs;   // the layout each input is needed in, on `stage`
  std::vector<NdSbp> outputs;  // the layout each output is produced in
  bool operator==(const NodeLayout&) const = default;
};

enum class BoxingEdgeKind : uint8_t {
  kOpInput,         // into input `input_index` of node `consumer` (any node kind)
  kVariableUpdate,  // an update value into its variable (`consumer` = the variable's node)
  kSink,            // a loss or fetch into the host sink (`consumer` = kNoNode)
};

// One conversion the plan needs: `value` as produced (`from`) to the layout
// its consumer needs (`to`).
struct BoxingEdge {
  BoxingEdgeKind kind = BoxingEdgeKind::kOpInput;
  graph::ValueId value = graph::kNoValue;
  graph::NodeId consumer = graph::kNoNode;
  int input_index = -1;  // kOpInput only
  ValueLayout from, to;
  double cost = 0;
  // DESIGN §7's conversion, axis by axis: "dp: P -> B (all-reduce)",
  // "dp: P -> B (all-reduce); tp: S(1) -> B (all-gather)", or
  // "across placements: stage 0 -> stage 1 (point-to-point)[, (S(0), B) -> (B, B)]".
  std::string description;
  bool operator==(const BoxingEdge&) const = default;
};

struct SbpAssignment {
  std::vector<NodeLayout> nodes;    // per NodeId
  std::vector<ValueLayout> values;  // per ValueId, as produced
  // Op-input edges in node order (inputs in order), then variable updates
  // (in variable id order), then the sink (losses, then fetches).
  std::vector<BoxingEdge> edges;
  double total_cost = 0;  // sum of the edges' costs

  // One line per node ("#3 matmul [stage 0] (S(0), B) x (B, B) -> (S(0), B)"),
  // then one per edge, then the total.
  std::string ToText(const graph::Graph& graph) const;
  bool operator==(const SbpAssignment&) const = default;
};

// The conversion in words, as BoxingEdge::description.
std::string DescribeBoxing(const ValueLayout& from, const ValueLayout& to);

// Errors: a layer_idx outside the mesh's layers; a malformed hint (not one
// entry per hierarchy axis, a split axis outside the value's rank); a
// variable hint that contradicts a hint on its update; an op with no
// candidate meeting its constraints (see above).
absl::StatusOr<SbpAssignment> InferSbp(const graph::Graph& graph, const DeviceMesh& mesh,
                                       const SbpInferOptions& options = {});

}  // namespace tessera::scheduler
