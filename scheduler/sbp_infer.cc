#include "scheduler/sbp_infer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "core/boxing_cost.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::scheduler {
namespace {

using graph::Graph;
using graph::Node;
using graph::NodeId;
using graph::NodeKind;
using graph::ValueId;

std::string AxisName(size_t axis) {
  if (axis == 0) return "dp";
  if (axis == 1) return "tp";
  return StrCat("axis ", axis);
}

std::string DescribeAxis(const Sbp& from, const Sbp& to) {
  std::string how;
  if (from.is_broadcast()) {
    if (to.is_split()) {
      how = "local slice";
    } else if (to.is_partial_sum()) {
      how = "local: kept on one rank, zeros elsewhere";
    } else {
      how = "local, no communication";  // B is already a valid P(max)
    }
  } else if (from.is_split()) {
    if (to.is_broadcast()) {
      how = from.axis() == 0 ? "all-gather" : "all-gather, then unpack";
    } else if (to.is_split()) {
      how = "all-to-all";
    } else {
      how = to.is_partial_sum() ? "local: zeros outside the shard" : "local: -inf outside the shard";
    }
  } else {
    const std::string reduce = from.is_partial_max() ? "all-reduce max" : "all-reduce";
    if (to.is_broadcast()) {
      how = reduce;
    } else if (to.is_split()) {
      how = StrCat(from.is_partial_max() ? "reduce-scatter max" : "reduce-scatter",
                   to.axis() != 0 ? ", packed first" : "");
    } else {
      how = StrCat(reduce, ", then local");
    }
  }
  return StrCat(from.ToString(), " -> ", to.ToString(), " (", how, ")");
}

int CountDiffering(const NdSbp& a, const NdSbp& b) {
  int n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i] == b[i] ? 0 : 1;
  return n;
}

// An infinite cost (no boxing route) equals only itself.
bool NearlyEqual(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return a == b;
  return std::fabs(a - b) <= 1e-9 * std::max({1.0, std::fabs(a), std::fabs(b)});
}

std::string NodeContext(const Node& node) {
  return StrCat("op '", node.op, "' (node ", node.id, node.scope.empty() ? "" : StrCat(", scope '", node.scope, "'"),
                ")");
}

std::string ValueContext(const graph::Value& value) {
  return StrCat(graph::ValueRef(value.id), value.name.empty() ? "" : StrCat(" '", value.name, "'"), " (",
                value.meta.ToString(), ")");
}

// "(S(0), B), (B, B) -> (S(0), B)"
std::string CandidateText(const std::vector<NdSbp>& inputs, const std::vector<NdSbp>& outputs) {
  std::vector<std::string> ins, outs;
  for (const NdSbp& s : inputs) ins.push_back(NdSbpToString(s));
  for (const NdSbp& s : outputs) outs.push_back(NdSbpToString(s));
  return StrCat(Join(ins, ", "), ins.empty() ? "-> " : " -> ", Join(outs, ", "));
}

// A layout an op output must have, and why (for error messages).
struct Constraint {
  NdSbp nd_sbp;
  std::string reason;  // "hinted (B, S(1))" / "updates variable 'w' laid out (B, B)"
};

struct Candidate {
  std::vector<size_t> index;  // per axis: index into that axis' signatures
  std::vector<NdSbp> inputs, outputs;
  double cost = 0;
  int partial_outputs = 0;
  int conversions = 0;
  int split_outputs = 0;
};

// Whether `a` beats `b` (the documented tie-break; a full tie keeps the
// earlier candidate).
bool Better(const Candidate& a, const Candidate& b) {
  if (!NearlyEqual(a.cost, b.cost)) return a.cost < b.cost;
  if (a.partial_outputs != b.partial_outputs) return a.partial_outputs < b.partial_outputs;
  if (a.conversions != b.conversions) return a.conversions < b.conversions;
  return a.split_outputs < b.split_outputs;
}

// Advances `index` to the next N-D candidate, axis 0 most significant (so
// candidates come in declaration order); false after the last.
bool NextCandidate(const std::vector<std::vector<ops::SbpSignature>>& per_axis, std::vector<size_t>& index) {
  for (size_t a = index.size(); a-- > 0;) {
    if (++index[a] < per_axis[a].size()) return true;
    index[a] = 0;
  }
  return false;
}

class Inferrer {
 public:
  Inferrer(const Graph& graph, const DeviceMesh& mesh, const SbpInferOptions& options)
      : graph_(graph), mesh_(mesh), options_(options), hierarchy_(mesh.hierarchy()) {}

  absl::StatusOr<SbpAssignment> Run() {
    RETURN_IF_ERROR(CheckOptions());
    out_.nodes.resize(static_cast<size_t>(graph_.num_nodes()));
    out_.values.resize(static_cast<size_t>(graph_.num_values()));
    RETURN_IF_ERROR(AssignStages());
    CollectUpdates();
    // Variable layouts first: an update may be produced before its variable's node.
    for (ValueId variable : graph_.Variables()) {
      ASSIGN_OR_RETURN(variable_layouts_[variable], VariableLayout(variable));
    }
    if (options_.zero_stage > 0) ShardForZero();
    for (const Node& node : graph_.nodes()) {
      switch (node.kind) {
        case NodeKind::kVariable:
          SetSource(node, variable_layouts_.at(node.outputs[0]));
          break;
        case NodeKind::kInput: {
          ASSIGN_OR_RETURN(std::optional<NdSbp> hint, Hint(node.outputs[0]));
          const TensorMeta& meta = graph_.value(node.outputs[0]).meta;
          SetSource(node, hint.has_value() ? *hint : CanonicalDefault(options_.default_input, meta));
          break;
        }
        case NodeKind::kRepeat:
        case NodeKind::kAcc:
          RETURN_IF_ERROR(InferPassThrough(node));
          break;
        case NodeKind::kOp:
          RETURN_IF_ERROR(InferOp(node));
          break;
      }
    }
    // Each update value into its variable.
    for (const auto& [variable, update] : graph_.variable_updates()) {
      AddEdge(BoxingEdgeKind::kVariableUpdate, update, graph_.value(variable).producer, -1,
              out_.values[static_cast<size_t>(variable)]);
    }
    // Losses and fetches into the host sink.
    std::set<ValueId> sunk;
    std::vector<ValueId> roots = graph_.losses();
    for (const auto& [name, value] : graph_.fetches()) roots.push_back(value);
    for (ValueId value : roots) {
      if (!sunk.insert(value).second) continue;
      const ValueLayout to{mesh_.num_stages() - 1, CanonicalDefault(options_.sink, graph_.value(value).meta)};
      AddEdge(BoxingEdgeKind::kSink, value, graph::kNoNode, -1, to);
    }
    for (const BoxingEdge& edge : out_.edges) out_.total_cost += edge.cost;
    return std::move(out_);
  }

 private:
  absl::Status CheckOptions() const {
    for (const NdSbp* nd : {&options_.default_input, &options_.default_variable, &options_.sink}) {
      if (nd->size() != hierarchy_.size()) {
        return absl::InvalidArgumentError(StrCat("sbp inference: option layout ", NdSbpToString(*nd), " needs ",
                                                 hierarchy_.size(), " entries (data parallel, tensor parallel)"));
      }
    }
    return absl::OkStatus();
  }

  // B on every axis of size 1.
  NdSbp Canonical(NdSbp nd) const {
    for (size_t a = 0; a < nd.size(); ++a) {
      if (hierarchy_[a] == 1) nd[a] = Sbp::Broadcast();
    }
    return nd;
  }

  // An option layout for a value of `meta`: splits the value cannot have
  // (a scalar's S(0)) become B.
  NdSbp CanonicalDefault(NdSbp nd, const TensorMeta& meta) const {
    for (Sbp& s : nd) {
      if (s.is_split() && s.axis() >= meta.shape.rank()) s = Sbp::Broadcast();
    }
    return Canonical(std::move(nd));
  }

  // The canonical sbp_hint of a value, checked against the mesh and the
  // value's rank.
  absl::StatusOr<std::optional<NdSbp>> Hint(ValueId id) const {
    const graph::Value& value = graph_.value(id);
    // Placements other than the job's devices are not built: a hint was
    // accepted and did nothing (it only kept fusions away).
    if (value.placement_hint.has_value()) {
      return absl::UnimplementedError(StrCat("sbp inference: ", ValueContext(value), " has a placement hint (",
                                             value.placement_hint->ToString(),
                                             "), which is not supported yet: every value lives on the job's devices "
                                             "(train.dist); leave its placement unset"));
    }
    if (!value.sbp_hint.has_value()) return std::optional<NdSbp>();
    const NdSbp& hint = *value.sbp_hint;
    if (hint.size() != hierarchy_.size()) {
      return absl::InvalidArgumentError(StrCat("sbp inference: hint ", NdSbpToString(hint), " of ", ValueContext(value),
                                               " needs ", hierarchy_.size(),
                                               " entries (data parallel, tensor parallel)"));
    }
    // A graph input or a variable is whole where it is fed or initialised:
    // as a partial sum, each rank's whole copy was one term (the values
    // came out summed over the axis, x2 on two ranks).
    const NodeKind kind = graph_.producer(id).kind;
    if ((kind == NodeKind::kInput || kind == NodeKind::kVariable) &&
        std::any_of(hint.begin(), hint.end(), [](const Sbp& s) { return s.is_partial(); })) {
      return absl::InvalidArgumentError(StrCat("sbp inference: hint ", NdSbpToString(hint), " of ", ValueContext(value),
                                               ": a ", kind == NodeKind::kInput ? "graph input" : "variable",
                                               " is split or broadcast, never partial (P)"));
    }
    for (const Sbp& s : hint) {
      if (s.is_split() && (s.axis() < 0 || s.axis() >= value.meta.shape.rank())) {
        return absl::InvalidArgumentError(StrCat("sbp inference: hint ", NdSbpToString(hint), " of ",
                                                 ValueContext(value), " splits axis ", s.axis(),
                                                 ", outside the value's rank ", value.meta.shape.rank()));
      }
    }
    return std::optional<NdSbp>(Canonical(hint));
  }

  // Stages from layer_idx; unassigned nodes follow their inputs (latest),
  // else their consumers (earliest), else stage 0.
  absl::Status AssignStages() {
    const size_t n = static_cast<size_t>(graph_.num_nodes());
    stages_.assign(n, -1);
    std::vector<std::vector<NodeId>> consumers(n);
    for (const Node& node : graph_.nodes()) {
      int64_t stage = -1;
      const bool unassigned = node.layer_idx == graph::kUnassignedLayer;
      if (!unassigned) {
        auto explicit_stage = mesh_.StageOfLayer(node.layer_idx);
        if (!explicit_stage.ok()) {
          return absl::InvalidArgumentError(
              StrCat("sbp inference: ", NodeContext(node), ": ", explicit_stage.status().message()));
        }
        stage = *explicit_stage;
      }
      for (ValueId input : node.inputs) {
        const NodeId producer = graph_.value(input).producer;
        consumers[static_cast<size_t>(producer)].push_back(node.id);
        if (unassigned) stage = std::max(stage, stages_[static_cast<size_t>(producer)]);
      }
      stages_[static_cast<size_t>(node.id)] = stage;
    }
    for (size_t i = n; i-- > 0;) {
      if (stages_[i] >= 0) continue;
      int64_t stage = -1;
      for (NodeId consumer : consumers[i]) {
        const int64_t s = stages_[static_cast<size_t>(consumer)];
        if (s >= 0 && (stage < 0 || s < stage)) stage = s;
      }
      stages_[i] = std::max<int64_t>(stage, 0);
    }
    return absl::OkStatus();
  }

  // update value -> variable; optimizer state variable -> its parameter.
  void CollectUpdates() {
    for (const auto& [variable, update] : graph_.variable_updates()) update_of_[update] = variable;
    for (const Node& node : graph_.nodes()) {
      if (node.kind != NodeKind::kOp || node.outputs.empty()) continue;
      auto param = update_of_.find(node.outputs[0]);
      if (param == update_of_.end()) continue;
      for (size_t k = 1; k < node.outputs.size(); ++k) {
        auto state = update_of_.find(node.outputs[k]);
        if (state != update_of_.end() && state->second != param->second) state_param_[state->second] = param->second;
      }
    }
  }

  absl::StatusOr<NdSbp> VariableLayout(ValueId variable) const {
    ASSIGN_OR_RETURN(std::optional<NdSbp> hint, Hint(variable));
    if (hint.has_value()) return *hint;
    auto param = state_param_.find(variable);
    if (param != state_param_.end() && graph_.IsVariable(param->second)) {
      ASSIGN_OR_RETURN(std::optional<NdSbp> param_hint, Hint(param->second));
      if (param_hint.has_value()) return *param_hint;
    }
    return CanonicalDefault(options_.default_variable, graph_.value(variable).meta);
  }

  // The layout output `value` must have: its hint, and the layout of the
  // variable it updates (which must agree).
  absl::StatusOr<std::optional<Constraint>> OutputConstraint(ValueId value) const {
    ASSIGN_OR_RETURN(std::optional<NdSbp> hint, Hint(value));
    std::optional<Constraint> constraint;
    if (hint.has_value()) constraint = Constraint{*hint, StrCat("hinted ", NdSbpToString(*hint))};
    auto update = update_of_.find(value);
    if (update != update_of_.end()) {
      const ValueId variable = update->second;
      const NdSbp& layout = variable_layouts_.at(variable);
      if (constraint.has_value() && constraint->nd_sbp != layout) {
        return absl::InvalidArgumentError(StrCat("sbp inference: ", ValueContext(graph_.value(value)), " is hinted ",
                                                 NdSbpToString(*hint), " but updates variable '",
                                                 graph_.value(variable).name, "' laid out ", NdSbpToString(layout)));
      }
      constraint = Constraint{
          layout, StrCat("updates variable '", graph_.value(variable).name, "' laid out ", NdSbpToString(layout))};
    }
    return constraint;
  }

  // ZeRO: the layout of `layout` (of a value of `meta`) sharded over the
  // data-parallel axis along the value's first axis of at least dp elements
  // that no other mesh axis splits; unchanged when there is none or the
  // layout is not B over dp.
  NdSbp Sharded(NdSbp layout, const TensorMeta& meta) const {
    if (hierarchy_.empty() || hierarchy_[0] <= 1 || !layout[0].is_broadcast()) return layout;
    for (int a = 0; a < meta.shape.rank(); ++a) {
      if (meta.shape[a] < hierarchy_[0]) continue;
      bool split_elsewhere = false;
      for (size_t j = 1; j < layout.size(); ++j) split_elsewhere |= layout[j].is_split() && layout[j].axis() == a;
      if (split_elsewhere) continue;
      layout[0] = Sbp::Split(a);
      return layout;
    }
    return layout;
  }

  // Every updated variable (trained parameters and their optimizer state)
  // sharded; readers other than its update get it unsharded; stage 2: the
  // accumulators of the gradients of sharded parameters are sharded too.
  void ShardForZero() {
    // A graph without updates (an evaluation of the trained model) shards
    // its trainable variables as the training graph does, so that its
    // plan holds the training plan's shards.
    std::set<ValueId> sharded;
    for (const auto& [variable, update] : graph_.variable_updates()) sharded.insert(variable);
    if (graph_.variable_updates().empty()) {
      for (ValueId variable : graph_.Variables()) {
        if (graph_.variable_info(variable).trainable) sharded.insert(variable);
      }
    }
    for (ValueId variable : sharded) {
      NdSbp& layout = variable_layouts_.at(variable);
      const NdSbp sharded = Sharded(layout, graph_.value(variable).meta);
      if (sharded == layout) continue;
      use_layout_[variable] = layout;
      zero_variable_[variable] = variable;
      layout = sharded;
    }
    for (const auto& [variable, update] : graph_.variable_updates()) {
      const Node& node = graph_.producer(update);
      update_nodes_.insert(node.id);
      if (options_.zero_stage < 2 || state_param_.contains(variable) || !use_layout_.contains(variable) ||
          node.inputs.size() < 2) {
        continue;
      }
      // The gradient (input 1) back through its scaling to the accumulator,
      // or to each stage's where it was accumulated per stage and the sums
      // added (graph::AccumulateGradients: a tied embedding's).
      std::vector<ValueId> pending = {node.inputs[1]};
      while (!pending.empty()) {
        const ValueId grad = pending.back();
        pending.pop_back();
        const Node& producer = graph_.producer(grad);
        if (producer.kind == NodeKind::kAcc) {
          if (graph_.value(grad).meta == graph_.value(variable).meta) sharded_accumulators_[grad] = variable;
          continue;
        }
        if (producer.kind != NodeKind::kOp || producer.inputs.empty()) continue;
        if (producer.op == "scalar_mul" || producer.op == "mul") {
          pending.push_back(producer.inputs[0]);
        } else if (producer.op == "add" && producer.inputs.size() == 2) {
          // Only a sum of accumulators (or of such sums).
          const auto summed = [&](ValueId v) {
            const Node& p = graph_.producer(v);
            return p.kind == NodeKind::kAcc || (p.kind == NodeKind::kOp && p.op == "add");
          };
          if (summed(producer.inputs[0]) && summed(producer.inputs[1])) {
            pending.push_back(producer.inputs[0]);
            pending.push_back(producer.inputs[1]);
          }
        }
      }
    }
  }

  // Per input of `node`: the layout ZeRO makes it read a sharded variable in
  // (its unsharded layout; the shard itself for the variable's update and
  // for stage 3's depend that holds it back).
  std::vector<std::optional<Constraint>> ZeroInputConstraints(const Node& node) const {
    std::vector<std::optional<Constraint>> out(node.inputs.size());
    if (use_layout_.empty() || update_nodes_.contains(node.id)) return out;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      auto use = use_layout_.find(node.inputs[i]);
      if (use == use_layout_.end()) continue;
      // The variable's own name: stage 3's repeat and depend of it have none.
      const auto variable = zero_variable_.find(node.inputs[i]);
      const std::string& name = graph_.value(variable != zero_variable_.end() ? variable->second : node.inputs[i]).name;
      if (node.op == "depend" && i == 0 && options_.zero_stage == 3) {
        const NdSbp& shard = out_.values[static_cast<size_t>(node.inputs[i])].nd_sbp;
        out[i] = Constraint{shard, StrCat("holds back ZeRO-3 shard '", name, "' ", NdSbpToString(shard))};
      } else {
        out[i] = Constraint{use->second,
                            StrCat("reads ZeRO-sharded '", name, "' gathered as ", NdSbpToString(use->second))};
      }
    }
    return out;
  }

  int64_t StageOf(const Node& node) const { return stages_[static_cast<size_t>(node.id)]; }

  void SetSource(const Node& node, NdSbp layout) {
    NodeLayout& nl = out_.nodes[static_cast<size_t>(node.id)];
    nl.stage = StageOf(node);
    for (const Sbp& s : layout) nl.signatures.push_back({{}, {s}});
    nl.outputs = {layout};
    out_.values[static_cast<size_t>(node.outputs[0])] = {nl.stage, std::move(layout)};
  }

  absl::Status InferPassThrough(const Node& node) {
    const ValueId input = node.inputs[0], output = node.outputs[0];
    ASSIGN_OR_RETURN(std::optional<Constraint> constraint, OutputConstraint(output));
    NdSbp layout = constraint.has_value() ? constraint->nd_sbp : out_.values[static_cast<size_t>(input)].nd_sbp;
    if (!constraint.has_value()) {
      // ZeRO: stages 1-2 gather a sharded variable once per iteration, before
      // its repeat; stage 3 repeats the shard. Stage 2's accumulator is sharded.
      if (auto use = use_layout_.find(input); use != use_layout_.end() && node.kind == NodeKind::kRepeat) {
        if (options_.zero_stage < 3) {
          layout = use->second;
        } else {
          use_layout_[output] = use->second;
          zero_variable_[output] = zero_variable_.at(input);
        }
      }
      if (auto acc = sharded_accumulators_.find(output); acc != sharded_accumulators_.end()) {
        layout = variable_layouts_.at(acc->second);
      }
    }
    NodeLayout& nl = out_.nodes[static_cast<size_t>(node.id)];
    nl.stage = StageOf(node);
    for (const Sbp& s : layout) nl.signatures.push_back({{s}, {s}});
    nl.inputs = {layout};
    nl.outputs = {layout};
    out_.values[static_cast<size_t>(output)] = {nl.stage, layout};
    AddEdge(BoxingEdgeKind::kOpInput, input, node.id, 0, {nl.stage, layout});
    return absl::OkStatus();
  }

  // The op's 1-D signatures over an axis of `p` devices.
  absl::StatusOr<std::vector<ops::SbpSignature>> AxisSignatures(const Node& node, const ops::OpSchema& schema,
                                                                const std::vector<TensorMeta>& metas, int64_t p) const {
    const ops::SbpSignature all_broadcast{std::vector<Sbp>(node.inputs.size(), Sbp::Broadcast()),
                                          std::vector<Sbp>(node.outputs.size(), Sbp::Broadcast())};
    if (p == 1) return std::vector<ops::SbpSignature>{all_broadcast};
    std::vector<ops::SbpSignature> sigs = schema.SbpSignatures(metas, node.attrs, p);
    if (sigs.empty()) return std::vector<ops::SbpSignature>{all_broadcast};
    for (const ops::SbpSignature& sig : sigs) {
      if (sig.inputs.size() != node.inputs.size() || sig.outputs.size() != node.outputs.size()) {
        return absl::InternalError(StrCat("sbp inference: ", NodeContext(node), " declares signature '", sig.ToString(),
                                          "' for ", node.inputs.size(), " inputs and ", node.outputs.size(),
                                          " outputs"));
      }
    }
    return sigs;
  }

  absl::Status InferOp(const Node& node) {
    const ops::OpSchema* schema = graph_.schema(node);
    TESSERA_CHECK(schema != nullptr, "op node ", node.id, " '", node.op, "' has no schema");
    const int64_t stage = StageOf(node);
    const size_t num_axes = hierarchy_.size();
    std::vector<TensorMeta> metas;
    for (ValueId input : node.inputs) metas.push_back(graph_.value(input).meta);

    std::vector<std::vector<ops::SbpSignature>> per_axis(num_axes);
    for (size_t a = 0; a < num_axes; ++a) {
      ASSIGN_OR_RETURN(per_axis[a], AxisSignatures(node, *schema, metas, hierarchy_[a]));
    }
    std::vector<std::optional<Constraint>> constraints;
    for (ValueId output : node.outputs) {
      ASSIGN_OR_RETURN(std::optional<Constraint> constraint, OutputConstraint(output));
      constraints.push_back(std::move(constraint));
    }
    const std::vector<std::optional<Constraint>> input_constraints = ZeroInputConstraints(node);
    std::vector<TensorMeta> output_metas;
    for (ValueId output : node.outputs) output_metas.push_back(graph_.value(output).meta);

    std::optional<Candidate> best;
    std::vector<Candidate> rejected;  // kept only to explain a failure
    int64_t unreachable = 0, candidates = 0;
    std::vector<size_t> index(num_axes, 0);
    do {
      Candidate c = Evaluate(node, per_axis, index, metas, stage);
      ++candidates;
      bool allowed = true;
      for (size_t j = 0; j < constraints.size(); ++j) {
        if (constraints[j].has_value() && c.outputs[j] != constraints[j]->nd_sbp) allowed = false;
      }
      for (size_t i = 0; i < input_constraints.size(); ++i) {
        if (input_constraints[i].has_value() && c.inputs[i] != input_constraints[i]->nd_sbp) allowed = false;
      }
      // Each axis's signature is valid alone; over several axes the splits
      // nest, which an op whose local computation depends on where shards
      // begin (reshape) checks for the whole combination.
      if (num_axes > 1 && !schema->NdSbpValid(metas, output_metas, c.inputs, c.outputs, hierarchy_)) allowed = false;
      // A candidate reading an input in a layout no boxing route reaches
      // from the produced one (P -> P(max)) is no candidate: it once won a
      // tie (depend reading a gradient as P(max)) and failed at run time.
      if (!std::isfinite(c.cost)) {
        allowed = false;
        ++unreachable;
      }
      if (allowed) {
        if (!best.has_value() || Better(c, *best)) best = std::move(c);
      } else if (!best.has_value()) {
        rejected.push_back(std::move(c));
      }
    } while (NextCandidate(per_axis, index));
    if (!best.has_value() && unreachable == candidates) {
      return absl::InvalidArgumentError(StrCat("sbp inference: every SBP signature of ", NodeContext(node),
                                               " reads an input in a layout no boxing reaches from the layout it "
                                               "is produced in"));
    }
    if (!best.has_value()) return NoCandidateError(node, constraints, input_constraints, rejected);
    // Stage 3: a depend that holds back a sharded variable hands on the shard,
    // which its readers read gathered.
    if (node.op == "depend" && options_.zero_stage == 3) {
      if (auto use = use_layout_.find(node.inputs[0]); use != use_layout_.end()) {
        use_layout_[node.outputs[0]] = use->second;
        zero_variable_[node.outputs[0]] = zero_variable_.at(node.inputs[0]);
      }
    }

    NodeLayout& nl = out_.nodes[static_cast<size_t>(node.id)];
    nl.stage = stage;
    for (size_t a = 0; a < num_axes; ++a) nl.signatures.push_back(per_axis[a][best->index[a]]);
    nl.inputs = best->inputs;
    nl.outputs = best->outputs;
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      out_.values[static_cast<size_t>(node.outputs[j])] = {stage, best->outputs[j]};
    }
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      AddEdge(BoxingEdgeKind::kOpInput, node.inputs[i], node.id, static_cast<int>(i), {stage, best->inputs[i]});
    }
    return absl::OkStatus();
  }

  Candidate Evaluate(const Node& node, const std::vector<std::vector<ops::SbpSignature>>& per_axis,
                     const std::vector<size_t>& index, const std::vector<TensorMeta>& metas, int64_t stage) const {
    Candidate c;
    c.index = index;
    c.inputs.assign(node.inputs.size(), NdSbp());
    c.outputs.assign(node.outputs.size(), NdSbp());
    for (size_t a = 0; a < per_axis.size(); ++a) {
      const ops::SbpSignature& sig = per_axis[a][index[a]];
      for (size_t i = 0; i < sig.inputs.size(); ++i) c.inputs[i].push_back(sig.inputs[i]);
      for (size_t j = 0; j < sig.outputs.size(); ++j) c.outputs[j].push_back(sig.outputs[j]);
    }
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      // A layout an earlier consumer already converted to is shared (the
      // lowering converts each value to each layout once): free here.
      if (converted_.contains({node.inputs[i], stage, NdSbpToString(c.inputs[i])})) continue;
      const ValueLayout& produced = out_.values[static_cast<size_t>(node.inputs[i])];
      c.cost += BoxingCost(metas[i], produced.nd_sbp, c.inputs[i], hierarchy_, produced.stage == stage);
      c.conversions += CountDiffering(produced.nd_sbp, c.inputs[i]);
    }
    for (const NdSbp& out : c.outputs) {
      for (const Sbp& s : out) {
        c.partial_outputs += s.is_partial() ? 1 : 0;
        c.split_outputs += s.is_split() ? 1 : 0;
      }
    }
    return c;
  }

  absl::Status NoCandidateError(const Node& node, const std::vector<std::optional<Constraint>>& constraints,
                                const std::vector<std::optional<Constraint>>& input_constraints,
                                const std::vector<Candidate>& candidates) const {
    std::vector<std::string> wanted;
    for (size_t j = 0; j < constraints.size(); ++j) {
      if (!constraints[j].has_value()) continue;
      wanted.push_back(StrCat("output ", j, " (", graph::ValueRef(node.outputs[j]), ") ", constraints[j]->reason));
    }
    for (size_t i = 0; i < input_constraints.size(); ++i) {
      if (!input_constraints[i].has_value()) continue;
      wanted.push_back(StrCat("input ", i, " (", graph::ValueRef(node.inputs[i]), ") ", input_constraints[i]->reason));
    }
    int nearest = -1;
    std::vector<std::string> listed;
    for (const Candidate& c : candidates) {
      int differing = 0;
      for (size_t j = 0; j < constraints.size(); ++j) {
        if (constraints[j].has_value()) differing += CountDiffering(c.outputs[j], constraints[j]->nd_sbp);
      }
      if (nearest < 0 || differing < nearest) {
        nearest = differing;
        listed.clear();
      }
      if (differing == nearest && listed.size() < 3) listed.push_back(CandidateText(c.inputs, c.outputs));
    }
    return absl::InvalidArgumentError(
        StrCat("sbp inference: no SBP signature of ", NodeContext(node), " meets its constraints: ", Join(wanted, "; "),
               "; nearest valid signatures (", nearest, nearest == 1 ? " entry" : " entries",
               " differing): ", Join(listed, " | ")));
  }

  // Records an edge when `value` as produced is not `to`.
  void AddEdge(BoxingEdgeKind kind, ValueId value, NodeId consumer, int input_index, const ValueLayout& to) {
    const ValueLayout& from = out_.values[static_cast<size_t>(value)];
    if (from == to) return;
    converted_.insert({value, to.stage, NdSbpToString(to.nd_sbp)});
    BoxingEdge edge;
    edge.kind = kind;
    edge.value = value;
    edge.consumer = consumer;
    edge.input_index = input_index;
    edge.from = from;
    edge.to = to;
    edge.cost = BoxingCost(graph_.value(value).meta, from.nd_sbp, to.nd_sbp, hierarchy_, from.stage == to.stage);
    edge.description = DescribeBoxing(from, to);
    out_.edges.push_back(std::move(edge));
  }

  const Graph& graph_;
  const DeviceMesh& mesh_;
  const SbpInferOptions& options_;
  const Hierarchy hierarchy_;
  std::vector<int64_t> stages_;             // per node
  std::map<ValueId, ValueId> update_of_;    // update value -> variable
  std::map<ValueId, ValueId> state_param_;  // optimizer state variable -> its parameter
  std::map<ValueId, NdSbp> variable_layouts_;
  // ZeRO: a value holding a sharded variable (the variable, stage 3's repeat
  // and depend of it) -> the layout its readers get it in.
  std::map<ValueId, NdSbp> use_layout_;
  std::map<ValueId, ValueId> zero_variable_;         // each key of use_layout_ -> the variable it holds
  std::map<ValueId, ValueId> sharded_accumulators_;  // stage 2: accumulator output -> its parameter
  std::set<NodeId> update_nodes_;                    // nodes producing a variable's update
  std::set<std::tuple<ValueId, int64_t, std::string>> converted_;  // (value, stage, nd-SBP) some edge makes
  SbpAssignment out_;
};

}  // namespace

std::string ValueLayout::ToString() const { return StrCat("stage ", stage, " ", NdSbpToString(nd_sbp)); }

std::string DescribeBoxing(const ValueLayout& from, const ValueLayout& to) {
  if (from.stage != to.stage) {
    std::string text = StrCat("across placements: stage ", from.stage, " -> stage ", to.stage, " (point-to-point)");
    if (from.nd_sbp != to.nd_sbp) text += StrCat(", ", NdSbpToString(from.nd_sbp), " -> ", NdSbpToString(to.nd_sbp));
    return text;
  }
  std::vector<std::string> parts;
  for (size_t a = 0; a < from.nd_sbp.size() && a < to.nd_sbp.size(); ++a) {
    if (from.nd_sbp[a] != to.nd_sbp[a])
      parts.push_back(StrCat(AxisName(a), ": ", DescribeAxis(from.nd_sbp[a], to.nd_sbp[a])));
  }
  return parts.empty() ? "same layout" : Join(parts, "; ");
}

std::string SbpAssignment::ToText(const graph::Graph& graph) const {
  std::string out;
  for (const Node& node : graph.nodes()) {
    const NodeLayout& nl = nodes[static_cast<size_t>(node.id)];
    std::string what = node.op;
    if (node.kind == NodeKind::kVariable || node.kind == NodeKind::kInput) {
      what += StrCat(" '", graph.value(node.outputs[0]).name, "'");
    }
    out += StrCat("#", node.id, " ", what, " [stage ", nl.stage, "] ", CandidateText(nl.inputs, nl.outputs), "\n");
  }
  for (const BoxingEdge& edge : edges) {
    std::string into;
    switch (edge.kind) {
      case BoxingEdgeKind::kOpInput:
        into = StrCat("#", edge.consumer, " input ", edge.input_index);
        break;
      case BoxingEdgeKind::kVariableUpdate:
        into = StrCat("variable '", graph.value(graph.node(edge.consumer).outputs[0]).name, "'");
        break;
      case BoxingEdgeKind::kSink:
        into = "sink";
        break;
    }
    out +=
        StrCat("edge ", graph::ValueRef(edge.value), " -> ", into, ": ", edge.description, ", cost ", edge.cost, "\n");
  }
  out += StrCat("total cost ", total_cost, "\n");
  return out;
}

absl::StatusOr<SbpAssignment> InferSbp(const graph::Graph& graph, const DeviceMesh& mesh,
                                       const SbpInferOptions& options) {
  return Inferrer(graph, mesh, options).Run();
}

}  // namespace tessera::scheduler
