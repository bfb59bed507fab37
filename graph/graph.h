#pragma once
// The logical IR (DESIGN §6): a Graph of Nodes and Values in global view.
//
// - A Node is one op application (kind kOp: an op name from the registry, its
//   canonical attributes, input value ids, output value ids), a variable
//   (kind kVariable: a value that persists across iterations, with an init
//   rule and a trainable flag) or a graph input (kind kInput: fed every
//   iteration, e.g. a data batch or the learning rate).
// - A Value is one tensor: its TensorMeta, the node and output index that
//   produce it, an optional name, and optional placement / SBP hints that the
//   scheduler treats as constraints.
//
// Everything is named by dense integer ids (NodeId, ValueId = index into the
// graph's tables); nothing holds a pointer into the graph, so a Graph is a
// plain value: copy it, pass it, serialise it. Nodes are appended only after
// all their inputs exist, so node order is always a topological order.
//
// Shape inference runs through the registry's InferMeta when a node is added:
// a bad op fails at once, with the op and the input shapes named. Every value
// is within the size limits of core/checked.h (inputs, variables and op
// outputs are checked when added), so code reading a graph may multiply its
// extents freely.
//
// Besides nodes the graph records its roots: the loss(es), named fetches
// (values the host reads back, e.g. metrics) and variable updates (variable
// value -> the value that becomes its content for the next iteration, emitted
// by the optimizer pass).
//
// Not thread-safe for concurrent mutation; concurrent const access is fine.
// The op registry is borrowed and must outlive the graph.

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/placement.h"
#include "core/sbp.h"
#include "core/tensor.h"
#include "ops/attr.h"
#include "ops/grad.h"
#include "ops/registry.h"

namespace tessera::graph {

using ValueId = ops::ValueId;
using NodeId = int64_t;
inline constexpr ValueId kNoValue = ops::kNoValue;
inline constexpr NodeId kNoNode = -1;
// Pipeline layers (DESIGN §7, LiBai's layer_idx): 0.. = that layer's stage;
// kLastLayer = the last stage; kUnassignedLayer = not given: the scheduler
// runs the node on the latest stage among its inputs' (else its consumers').
inline constexpr int64_t kLastLayer = -1;
inline constexpr int64_t kUnassignedLayer = std::numeric_limits<int64_t>::min();
inline constexpr int64_t kNoSegment = -1;

// kRepeat and kAcc implement gradient accumulation over m micro-batches
// (attr num_micro_batches = m; output meta = input meta):
//   repeat(x): x is produced once per iteration and read by each of the m
//              micro-batches (placed after variables; zero-copy at runtime).
//   acc(g):    g is produced once per micro-batch; the output, the sum of the
//              m values, once per iteration (placed before the optimizer).
// Nodes that depend on a repeat output (and not through an acc) run once per
// micro-batch; the rest once per iteration.
enum class NodeKind : uint8_t { kOp, kVariable, kInput, kRepeat, kAcc };

// How a variable gets its first value: an op without inputs (normal,
// uniform, zeros, ones, fill) and its attributes. The graph adds `shape`
// (and `dtype` for ops that take one) when the variable is created.
struct InitRule {
  std::string op;
  ops::AttrMap attrs;

  static InitRule Zeros();
  static InitRule Ones();
  static InitRule Constant(double value);
  // N(mean, std^2) drawn from Philox keyed by (seed, tensor_id): the same
  // numbers under any parallel layout.
  static InitRule Normal(double mean, double std, int64_t seed, int64_t tensor_id);
  static InitRule Uniform(double low, double high, int64_t seed, int64_t tensor_id);
};

// What a variable node carries beyond an op node.
struct VariableInfo {
  InitRule init;  // canonical: attrs include shape (and dtype where the op has one)
  bool trainable = true;
  // Whether the optimizer applies weight decay; nullopt lets the optimizer's
  // name patterns decide (biases and norm parameters excluded by default).
  std::optional<bool> weight_decay;
};

struct Node {
  NodeId id = kNoNode;
  NodeKind kind = NodeKind::kOp;
  std::string op;         // op name; "variable" / "input" / "repeat" / "acc" for those kinds
  ops::AttrMap attrs;     // canonical (defaults filled in); repeat / acc: num_micro_batches
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  int64_t layer_idx = kUnassignedLayer;  // pipeline layer; -1 = last stage
  std::string scope;       // name scope, e.g. "h.3.attn"; autodiff nodes get "grad/" prefixed
  // Set by Autodiff on every node it emits (the backward graph) and kept by
  // passes that copy nodes; what the scheduler goes by, never the scope.
  bool backward = false;
  // Forward nodes of one recomputable segment (a transformer layer, marked
  // by nn/ through GraphBuilder::Recomputable) share an id >= 0; the
  // activation-checkpointing pass recomputes a segment in backward instead
  // of keeping its values (graph/passes.h RecomputeSegments). -1: none.
  int64_t checkpoint_segment = kNoSegment;
  std::optional<VariableInfo> variable;  // set iff kind == kVariable
};

struct Value {
  ValueId id = kNoValue;
  TensorMeta meta;
  NodeId producer = kNoNode;
  int output_index = 0;
  std::string name;  // variables and inputs always have one; op outputs may
  std::optional<Placement> placement_hint;
  std::optional<NdSbp> sbp_hint;
};

// Optional extras for a new op / input node.
struct NodeOptions {
  int64_t layer_idx = kUnassignedLayer;
  std::string scope = {};
  std::string name = {};  // names the node's first output
  bool backward = false;  // Node::backward
  int64_t checkpoint_segment = kNoSegment;  // Node::checkpoint_segment
};

struct VariableOptions {
  bool trainable = true;
  DType dtype = DType::kF32;
  std::optional<bool> weight_decay = std::nullopt;
  std::optional<Placement> placement = std::nullopt;
  std::optional<NdSbp> sbp = std::nullopt;
  int64_t layer_idx = kUnassignedLayer;
  std::string scope = {};
};

class Graph {
 public:
  // `registry` null = ops::BuiltinOps().
  explicit Graph(const ops::OpRegistry* registry = nullptr);

  // Appends op(inputs; attrs) and returns its output value ids. Errors (unknown
  // op or value, bad attributes, shape/dtype mismatch) name the op and the
  // input metas.
  absl::StatusOr<std::vector<ValueId>> AddOp(std::string_view op, const std::vector<ValueId>& inputs,
                                             const ops::AttrMap& attrs = {}, const NodeOptions& options = {});
  // A variable of `shape` initialised by `init` (which must produce exactly
  // that shape and options.dtype). Names are unique among variables.
  absl::StatusOr<ValueId> AddVariable(std::string name, const Shape& shape, const InitRule& init,
                                      const VariableOptions& options = {});
  // A graph input fed per iteration. Names are unique among inputs.
  absl::StatusOr<ValueId> AddInput(std::string name, const TensorMeta& meta, const NodeOptions& options = {});

  // Gradient-accumulation nodes (see NodeKind); num_micro_batches >= 1.
  absl::StatusOr<ValueId> AddRepeat(ValueId value, int64_t num_micro_batches, const NodeOptions& options = {});
  absl::StatusOr<ValueId> AddAcc(ValueId value, int64_t num_micro_batches, const NodeOptions& options = {});

  absl::Status MarkLoss(ValueId value);
  // Fetch names are unique.
  absl::Status MarkFetch(std::string name, ValueId value);
  // After each iteration `variable` takes the content of `new_value` (same
  // meta). Replaces an earlier update of the same variable.
  absl::Status SetVariableUpdate(ValueId variable, ValueId new_value);
  absl::Status SetHints(ValueId value, std::optional<Placement> placement, std::optional<NdSbp> sbp);

  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  int64_t num_values() const { return static_cast<int64_t>(values_.size()); }
  // Ids must be valid (CHECKed: an invalid id is a bug in the caller).
  const Node& node(NodeId id) const;
  const Value& value(ValueId id) const;
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  bool IsValidValue(ValueId id) const { return id >= 0 && id < num_values(); }
  // The producing node of a value.
  const Node& producer(ValueId id) const { return node(value(id).producer); }

  const std::vector<ValueId>& losses() const { return losses_; }
  const std::vector<std::pair<std::string, ValueId>>& fetches() const { return fetches_; }
  const std::map<ValueId, ValueId>& variable_updates() const { return variable_updates_; }

  // Values of variable / input nodes, in creation order.
  std::vector<ValueId> Variables() const;
  std::vector<ValueId> Inputs() const;
  bool IsVariable(ValueId id) const { return producer(id).kind == NodeKind::kVariable; }
  // The VariableInfo of a variable value (CHECKs that it is one).
  const VariableInfo& variable_info(ValueId id) const;
  absl::StatusOr<ValueId> FindVariable(std::string_view name) const;
  absl::StatusOr<ValueId> FindInput(std::string_view name) const;
  absl::StatusOr<ValueId> FindFetch(std::string_view name) const;

  // The op's schema, or null for non-op nodes (variable, input, repeat, acc).
  const ops::OpSchema* schema(const Node& node) const;
  const ops::OpRegistry& registry() const { return *registry_; }

  // Keeps the nodes with keep[node id] true (their inputs must be kept too)
  // and renumbers nodes and values densely in the old order. Roots on removed
  // values are dropped. Returns old value id -> new value id (kNoValue when
  // removed).
  absl::StatusOr<std::vector<ValueId>> KeepNodes(const std::vector<bool>& keep);

  // One line per node, e.g. `%5 = matmul(%3, %4) {transpose_b=true} : f32(8, 16)`
  // (attributes at their defaults are left out), then the roots.
  std::string ToText() const;
  // Graphviz: ops as boxes, variables as ellipses, inputs as parallelograms,
  // edges labelled with the value id and meta.
  std::string ToDot() const;

 private:
  absl::Status CheckValue(ValueId id, std::string_view what) const;
  absl::StatusOr<ValueId> AddAccumulationNode(NodeKind kind, ValueId value, int64_t num_micro_batches,
                                              const NodeOptions& options);
  ValueId AppendValue(const TensorMeta& meta, NodeId producer, int output_index, std::string name);

  const ops::OpRegistry* registry_;
  std::vector<Node> nodes_;
  std::vector<Value> values_;
  std::vector<ValueId> losses_;
  std::vector<std::pair<std::string, ValueId>> fetches_;
  std::map<ValueId, ValueId> variable_updates_;
  // Variable name -> value, so that adding n variables is not O(n^2).
  std::map<std::string, ValueId, std::less<>> variables_by_name_;
};

// "%5"
std::string ValueRef(ValueId id);

}  // namespace tessera::graph
