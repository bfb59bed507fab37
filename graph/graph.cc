#include "graph/graph.h"

#include <algorithm>
#include <cmath>

#include "core/checked.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::graph {

InitRule InitRule::Zeros() { return {"zeros", {}}; }
InitRule InitRule::Ones() { return {"ones", {}}; }
InitRule InitRule::Constant(double value) { return {"fill", {{"value", value}}}; }
InitRule InitRule::Normal(double mean, double std, int64_t seed, int64_t tensor_id) {
  return {"normal", {{"mean", mean}, {"std", std}, {"seed", seed}, {"tensor_id", tensor_id}}};
}
InitRule InitRule::Uniform(double low, double high, int64_t seed, int64_t tensor_id) {
  return {"uniform", {{"low", low}, {"high", high}, {"seed", seed}, {"tensor_id", tensor_id}}};
}

std::string ValueRef(ValueId id) { return StrCat("%", id); }

Graph::Graph(const ops::OpRegistry* registry) : registry_(registry ? registry : &ops::BuiltinOps()) {}

const Node& Graph::node(NodeId id) const {
  TESSERA_CHECK(id >= 0 && id < num_nodes(), "node id ", id, " out of range [0, ", num_nodes(), ")");
  return nodes_[static_cast<size_t>(id)];
}

const Value& Graph::value(ValueId id) const {
  TESSERA_CHECK(IsValidValue(id), "value id ", id, " out of range [0, ", num_values(), ")");
  return values_[static_cast<size_t>(id)];
}

absl::Status Graph::CheckValue(ValueId id, std::string_view what) const {
  if (!IsValidValue(id)) {
    return absl::InvalidArgumentError(
        StrCat(what, ": value ", ValueRef(id), " does not exist (graph has ", num_values(), " values)"));
  }
  return absl::OkStatus();
}

ValueId Graph::AppendValue(const TensorMeta& meta, NodeId producer, int output_index, std::string name) {
  Value v;
  v.id = num_values();
  v.meta = meta;
  v.producer = producer;
  v.output_index = output_index;
  v.name = std::move(name);
  values_.push_back(std::move(v));
  return values_.back().id;
}

absl::StatusOr<std::vector<ValueId>> Graph::AddOp(std::string_view op, const std::vector<ValueId>& inputs,
                                                  const ops::AttrMap& attrs, const NodeOptions& options) {
  ASSIGN_OR_RETURN(const ops::OpSchema* schema, registry_->Get(op));
  std::vector<TensorMeta> metas;
  metas.reserve(inputs.size());
  for (ValueId id : inputs) {
    RETURN_IF_ERROR(CheckValue(id, StrCat("op '", op, "'")));
    metas.push_back(value(id).meta);
  }
  ASSIGN_OR_RETURN(ops::AttrMap canonical, schema->CanonicalizeAttrs(attrs));
  // InferMeta checks every output's size (ops/op_schema.h); the scope says
  // where in the model the op sits.
  auto out_metas = schema->InferMeta(metas, canonical);
  if (!out_metas.ok() && !options.scope.empty()) {
    return absl::Status(out_metas.status().code(), StrCat(options.scope, ": ", out_metas.status().message()));
  }
  if (!out_metas.ok()) return out_metas.status();

  Node n;
  n.id = num_nodes();
  n.kind = NodeKind::kOp;
  n.op = schema->name();
  n.attrs = std::move(canonical);
  n.inputs = inputs;
  n.layer_idx = options.layer_idx;
  n.scope = options.scope;
  n.backward = options.backward;
  n.checkpoint_segment = options.checkpoint_segment;
  for (size_t i = 0; i < out_metas->size(); ++i) {
    n.outputs.push_back(AppendValue((*out_metas)[i], n.id, static_cast<int>(i), i == 0 ? options.name : ""));
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs;
}

namespace {

// A variable or input with a dimension of 0 holds nothing: a model of it
// trained to a NaN loss (a mean over no elements) without a word.
absl::Status CheckNotEmpty(const std::string& what, const Shape& shape) {
  for (int64_t d = 0; d < shape.rank(); ++d) {
    if (shape[d] == 0) {
      return absl::InvalidArgumentError(
          StrCat(what, ": shape ", shape.ToString(), " has a dimension of 0 (every dimension must be at least 1)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ValueId> Graph::AddVariable(std::string name, const Shape& shape, const InitRule& init,
                                           const VariableOptions& options) {
  if (name.empty()) return absl::InvalidArgumentError("a variable needs a name");
  if (FindVariable(name).ok()) return absl::AlreadyExistsError(StrCat("variable '", name, "' already exists"));
  if (auto bytes = CheckedByteSize({options.dtype, shape}); !bytes.ok()) {
    return absl::InvalidArgumentError(StrCat("variable '", name, "': ", bytes.status().message()));
  }
  RETURN_IF_ERROR(CheckNotEmpty(StrCat("variable '", name, "'"), shape));
  ASSIGN_OR_RETURN(const ops::OpSchema* schema, registry_->Get(init.op));
  if (!schema->inputs().empty()) {
    return absl::InvalidArgumentError(
        StrCat("variable '", name, "': init op '", init.op, "' takes inputs; use one that creates a tensor"));
  }
  ops::AttrMap attrs = init.attrs;
  attrs.Set("shape", shape.dims());
  const bool has_dtype = std::any_of(schema->attrs().begin(), schema->attrs().end(),
                                     [](const ops::AttrDef& a) { return a.name == "dtype"; });
  if (has_dtype) attrs.Set("dtype", options.dtype);
  auto canonical = schema->CanonicalizeAttrs(attrs);
  if (!canonical.ok()) {
    return absl::InvalidArgumentError(StrCat("variable '", name, "': ", canonical.status().message()));
  }
  // (fill takes any value as an op, -inf for a mask; a variable starting
  // at NaN or infinity could only make a NaN loss.)
  if (schema->name() == "fill" && !std::isfinite(canonical->Float("value"))) {
    return absl::InvalidArgumentError(
        StrCat("variable '", name, "': init value ", canonical->Float("value"), " is not finite"));
  }
  auto metas = schema->InferMeta({}, *canonical);
  if (!metas.ok()) return absl::InvalidArgumentError(StrCat("variable '", name, "': ", metas.status().message()));
  const TensorMeta want{options.dtype, shape};
  if (metas->size() != 1 || metas->front() != want) {
    return absl::InvalidArgumentError(StrCat("variable '", name, "' is ", want.ToString(), " but init op '",
                                             init.op, "' makes ",
                                             metas->empty() ? std::string("nothing") : metas->front().ToString()));
  }

  Node n;
  n.id = num_nodes();
  n.kind = NodeKind::kVariable;
  n.op = "variable";
  n.layer_idx = options.layer_idx;
  n.scope = options.scope;
  n.variable = VariableInfo{InitRule{schema->name(), *std::move(canonical)}, options.trainable,
                            options.weight_decay};
  const ValueId out = AppendValue(want, n.id, 0, std::move(name));
  values_.back().placement_hint = options.placement;
  values_.back().sbp_hint = options.sbp;
  n.outputs.push_back(out);
  nodes_.push_back(std::move(n));
  variables_by_name_[values_.back().name] = out;
  return out;
}

absl::StatusOr<ValueId> Graph::AddInput(std::string name, const TensorMeta& meta, const NodeOptions& options) {
  if (name.empty()) return absl::InvalidArgumentError("a graph input needs a name");
  if (FindInput(name).ok()) return absl::AlreadyExistsError(StrCat("graph input '", name, "' already exists"));
  if (auto bytes = CheckedByteSize(meta); !bytes.ok()) {
    return absl::InvalidArgumentError(StrCat("graph input '", name, "': ", bytes.status().message()));
  }
  RETURN_IF_ERROR(CheckNotEmpty(StrCat("graph input '", name, "'"), meta.shape));
  Node n;
  n.id = num_nodes();
  n.kind = NodeKind::kInput;
  n.op = "input";
  n.layer_idx = options.layer_idx;
  n.scope = options.scope;
  n.backward = options.backward;
  n.outputs.push_back(AppendValue(meta, n.id, 0, std::move(name)));
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs.front();
}

absl::StatusOr<ValueId> Graph::AddAccumulationNode(NodeKind kind, ValueId input, int64_t num_micro_batches,
                                                   const NodeOptions& options) {
  const char* op = kind == NodeKind::kRepeat ? "repeat" : "acc";
  RETURN_IF_ERROR(CheckValue(input, op));
  if (num_micro_batches < 1) {
    return absl::InvalidArgumentError(StrCat(op, ": num_micro_batches must be >= 1, got ", num_micro_batches));
  }
  Node n;
  n.id = num_nodes();
  n.kind = kind;
  n.op = op;
  n.attrs.Set("num_micro_batches", num_micro_batches);
  n.inputs = {input};
  n.layer_idx = options.layer_idx;
  n.scope = options.scope;
  n.backward = options.backward;
  n.outputs.push_back(AppendValue(value(input).meta, n.id, 0, options.name));
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs.front();
}

absl::StatusOr<ValueId> Graph::AddRepeat(ValueId input, int64_t num_micro_batches, const NodeOptions& options) {
  return AddAccumulationNode(NodeKind::kRepeat, input, num_micro_batches, options);
}

absl::StatusOr<ValueId> Graph::AddAcc(ValueId input, int64_t num_micro_batches, const NodeOptions& options) {
  return AddAccumulationNode(NodeKind::kAcc, input, num_micro_batches, options);
}

absl::Status Graph::MarkLoss(ValueId id) {
  RETURN_IF_ERROR(CheckValue(id, "loss"));
  if (std::find(losses_.begin(), losses_.end(), id) == losses_.end()) losses_.push_back(id);
  return absl::OkStatus();
}

absl::Status Graph::MarkFetch(std::string name, ValueId id) {
  RETURN_IF_ERROR(CheckValue(id, StrCat("fetch '", name, "'")));
  if (name.empty()) return absl::InvalidArgumentError("a fetch needs a name (its callback's key)");
  if (FindFetch(name).ok()) return absl::AlreadyExistsError(StrCat("fetch '", name, "' already exists"));
  fetches_.emplace_back(std::move(name), id);
  return absl::OkStatus();
}

absl::Status Graph::SetVariableUpdate(ValueId variable, ValueId new_value) {
  RETURN_IF_ERROR(CheckValue(variable, "variable update"));
  RETURN_IF_ERROR(CheckValue(new_value, "variable update"));
  if (!IsVariable(variable)) {
    return absl::InvalidArgumentError(StrCat("variable update: ", ValueRef(variable), " is not a variable"));
  }
  if (value(variable).meta != value(new_value).meta) {
    return absl::InvalidArgumentError(StrCat("update of variable '", value(variable).name, "' ",
                                             value(variable).meta.ToString(), " with ", ValueRef(new_value), " ",
                                             value(new_value).meta.ToString()));
  }
  variable_updates_[variable] = new_value;
  return absl::OkStatus();
}

absl::Status Graph::SetHints(ValueId id, std::optional<Placement> placement, std::optional<NdSbp> sbp) {
  RETURN_IF_ERROR(CheckValue(id, "hints"));
  values_[static_cast<size_t>(id)].placement_hint = std::move(placement);
  values_[static_cast<size_t>(id)].sbp_hint = std::move(sbp);
  return absl::OkStatus();
}

std::vector<ValueId> Graph::Variables() const {
  std::vector<ValueId> out;
  for (const Node& n : nodes_) {
    if (n.kind == NodeKind::kVariable) out.push_back(n.outputs.front());
  }
  return out;
}

std::vector<ValueId> Graph::Inputs() const {
  std::vector<ValueId> out;
  for (const Node& n : nodes_) {
    if (n.kind == NodeKind::kInput) out.push_back(n.outputs.front());
  }
  return out;
}

const VariableInfo& Graph::variable_info(ValueId id) const {
  const Node& n = producer(id);
  TESSERA_CHECK(n.variable.has_value(), ValueRef(id), " is not a variable");
  return *n.variable;
}

absl::StatusOr<ValueId> Graph::FindVariable(std::string_view name) const {
  if (auto it = variables_by_name_.find(name); it != variables_by_name_.end()) return it->second;
  return absl::NotFoundError(StrCat("no variable named '", name, "'"));
}

absl::StatusOr<ValueId> Graph::FindInput(std::string_view name) const {
  for (const Node& n : nodes_) {
    if (n.kind == NodeKind::kInput && value(n.outputs.front()).name == name) return n.outputs.front();
  }
  return absl::NotFoundError(StrCat("no graph input named '", name, "'"));
}

absl::StatusOr<ValueId> Graph::FindFetch(std::string_view name) const {
  for (const auto& [fetch_name, id] : fetches_) {
    if (fetch_name == name) return id;
  }
  return absl::NotFoundError(StrCat("no fetch named '", name, "'"));
}

const ops::OpSchema* Graph::schema(const Node& n) const {
  return n.kind == NodeKind::kOp ? registry_->Find(n.op) : nullptr;
}

absl::StatusOr<std::vector<ValueId>> Graph::KeepNodes(const std::vector<bool>& keep) {
  if (static_cast<int64_t>(keep.size()) != num_nodes()) {
    return absl::InvalidArgumentError(StrCat("KeepNodes: ", keep.size(), " flags for ", num_nodes(), " nodes"));
  }
  std::vector<ValueId> remap(values_.size(), kNoValue);
  std::vector<Node> nodes;
  std::vector<Value> values;
  for (const Node& old : nodes_) {  // copies: the graph stays untouched on error
    if (!keep[static_cast<size_t>(old.id)]) continue;
    Node n = old;
    for (ValueId& in : n.inputs) {
      const ValueId mapped = remap[static_cast<size_t>(in)];
      if (mapped == kNoValue) {
        return absl::InvalidArgumentError(StrCat("KeepNodes: node ", n.id, " (", n.op, ") is kept but its input ",
                                                 ValueRef(in), " is removed"));
      }
      in = mapped;
    }
    n.id = static_cast<NodeId>(nodes.size());
    for (ValueId& out : n.outputs) {
      Value v = values_[static_cast<size_t>(out)];
      v.id = static_cast<ValueId>(values.size());
      v.producer = n.id;
      remap[static_cast<size_t>(out)] = v.id;
      out = v.id;
      values.push_back(std::move(v));
    }
    nodes.push_back(std::move(n));
  }
  std::vector<ValueId> losses;
  for (ValueId id : losses_) {
    if (remap[static_cast<size_t>(id)] != kNoValue) losses.push_back(remap[static_cast<size_t>(id)]);
  }
  std::vector<std::pair<std::string, ValueId>> fetches;
  for (auto& [name, id] : fetches_) {
    if (remap[static_cast<size_t>(id)] != kNoValue) fetches.emplace_back(name, remap[static_cast<size_t>(id)]);
  }
  std::map<ValueId, ValueId> updates;
  for (const auto& [var, new_value] : variable_updates_) {
    const ValueId a = remap[static_cast<size_t>(var)], b = remap[static_cast<size_t>(new_value)];
    if (a != kNoValue && b != kNoValue) updates[a] = b;
  }
  std::map<std::string, ValueId, std::less<>> variables_by_name;
  for (const Node& n : nodes) {
    if (n.kind == NodeKind::kVariable) variables_by_name[values[static_cast<size_t>(n.outputs.front())].name] = n.outputs.front();
  }
  nodes_ = std::move(nodes);
  values_ = std::move(values);
  variables_by_name_ = std::move(variables_by_name);
  losses_ = std::move(losses);
  fetches_ = std::move(fetches);
  variable_updates_ = std::move(updates);
  return remap;
}

}  // namespace tessera::graph
