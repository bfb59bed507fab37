// Gradient accumulation: repeat after variables, acc before the optimizer.

#include <algorithm>

#include "core/status.h"
#include "core/text.h"
#include "graph/passes.h"

namespace tessera::graph {

namespace {

// A value's pipeline layer: its producer's layer_idx.
int64_t LayerOf(const Graph& graph, ValueId v) { return graph.producer(v).layer_idx; }

// The terms of gradient `v` summed across pipeline stages: the leaves of
// its tree of adds (SumTerms) when they are made on two or more stages,
// else `v` is the one term. A leaf of an unassigned layer (its stage is the
// scheduler's choice), or a tree too large, keeps `v` whole.
std::vector<ValueId> CrossStageTerms(const Graph& graph, ValueId v, const SameStageFn& same_stage) {
  const std::vector<ValueId> leaves = SumTerms(graph, v);
  if (leaves.empty()) return {v};
  bool spans_stages = false;
  for (ValueId leaf : leaves) {
    if (LayerOf(graph, leaf) == kUnassignedLayer) return {v};
    spans_stages = spans_stages || !same_stage(LayerOf(graph, leaves.front()), LayerOf(graph, leaf));
  }
  return spans_stages ? leaves : std::vector<ValueId>{v};
}

}  // namespace

std::vector<ValueId> SumTerms(const Graph& graph, ValueId v) {
  const TensorMeta& meta = graph.value(v).meta;
  std::vector<ValueId> leaves, pending = {v};
  while (!pending.empty()) {
    if (leaves.size() + pending.size() > kMaxSumTerms) return {};
    const ValueId t = pending.back();
    pending.pop_back();
    const Node& producer = graph.producer(t);
    if (producer.kind == NodeKind::kOp && producer.op == "add" && producer.inputs.size() == 2 &&
        graph.value(producer.inputs[0]).meta == meta && graph.value(producer.inputs[1]).meta == meta) {
      pending.push_back(producer.inputs[1]);  // the first input's leaves first
      pending.push_back(producer.inputs[0]);
      continue;
    }
    leaves.push_back(t);
  }
  return leaves;
}

absl::StatusOr<AccumulationResult> AccumulateGradients(Graph& graph, const GradientMap& gradients,
                                                       int64_t num_micro_batches, const SameStageFn& same_stage,
                                                       bool root_scaled) {
  if (num_micro_batches < 1) {
    return absl::InvalidArgumentError(
        StrCat("gradient accumulation: num_micro_batches must be >= 1, got ", num_micro_batches));
  }
  AccumulationResult result;
  if (num_micro_batches == 1) {
    result.gradients = gradients;
    for (ValueId id = 0; id < graph.num_values(); ++id) result.remap.push_back(id);
    return result;
  }

  // Variables that ops read get a repeat node right after them: the graph is
  // replayed into a new one, since nodes are only ever appended.
  std::vector<bool> read_by_ops(static_cast<size_t>(graph.num_values()), false);
  for (const Node& n : graph.nodes()) {
    if (n.kind == NodeKind::kRepeat || n.kind == NodeKind::kAcc) {
      return absl::FailedPreconditionError("gradient accumulation: the graph is already accumulated");
    }
    for (ValueId in : n.inputs) read_by_ops[static_cast<size_t>(in)] = true;
  }

  Graph out(&graph.registry());
  std::vector<ValueId>& remap = result.remap;
  remap.assign(static_cast<size_t>(graph.num_values()), kNoValue);
  // What ops read instead of a variable: its repeats, one per pipeline stage
  // that reads it (the variable's own first), each on that stage, so a
  // variable read on another stage (a tied embedding) crosses once per
  // iteration and is repeated there. Readers of an unassigned layer, and
  // every reader of a variable of an unassigned layer or with one stage,
  // read the variable's own repeat.
  struct StageRepeat {
    int64_t layer_idx;
    ValueId repeated;
  };
  std::vector<std::vector<StageRepeat>> repeats_of(static_cast<size_t>(graph.num_values()));
  const auto repeat_for = [&](ValueId variable, int64_t reader_layer) -> absl::StatusOr<ValueId> {
    std::vector<StageRepeat>& repeats = repeats_of[static_cast<size_t>(variable)];
    const Node& var_node = graph.producer(variable);
    const bool own = !same_stage || var_node.layer_idx == kUnassignedLayer || reader_layer == kUnassignedLayer ||
                     same_stage(reader_layer, var_node.layer_idx);
    const int64_t layer = own ? var_node.layer_idx : reader_layer;
    for (const StageRepeat& r : repeats) {
      if (r.layer_idx == layer || (layer != kUnassignedLayer && r.layer_idx != kUnassignedLayer && same_stage &&
                                   same_stage(r.layer_idx, layer))) {
        return r.repeated;
      }
    }
    ASSIGN_OR_RETURN(
        ValueId repeated,
        out.AddRepeat(remap[static_cast<size_t>(variable)], num_micro_batches,
                      {.layer_idx = layer, .scope = var_node.scope, .name = "", .backward = var_node.backward}));
    repeats.push_back({layer, repeated});
    return repeated;
  };
  for (const Node& n : graph.nodes()) {
    const NodeOptions at = ReplayOptions(graph, n);
    std::vector<ValueId> outputs;
    switch (n.kind) {
      case NodeKind::kInput:
      case NodeKind::kVariable: {
        ASSIGN_OR_RETURN(ValueId id, ReplayLeaf(graph, n, out));
        outputs = {id};
        remap[static_cast<size_t>(n.outputs[0])] = id;
        // The variable's own repeat right after it, as the reads on its stage expect.
        if (n.kind == NodeKind::kVariable && read_by_ops[static_cast<size_t>(n.outputs[0])]) {
          RETURN_IF_ERROR(repeat_for(n.outputs[0], n.layer_idx).status());
        }
        break;
      }
      case NodeKind::kOp: {
        std::vector<ValueId> inputs;
        for (ValueId in : n.inputs) {
          if (graph.IsVariable(in)) {
            ASSIGN_OR_RETURN(ValueId repeated, repeat_for(in, n.layer_idx));
            inputs.push_back(repeated);
          } else {
            inputs.push_back(remap[static_cast<size_t>(in)]);
          }
        }
        ASSIGN_OR_RETURN(outputs, out.AddOp(n.op, inputs, n.attrs, at));
        break;
      }
      case NodeKind::kRepeat:
      case NodeKind::kAcc:
        break;  // rejected above
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Value& old = graph.value(n.outputs[i]);
      remap[static_cast<size_t>(old.id)] = outputs[i];
      if (old.placement_hint || old.sbp_hint)
        RETURN_IF_ERROR(out.SetHints(outputs[i], old.placement_hint, old.sbp_hint));
    }
  }
  // Losses and fetches computed per micro-batch become their mean over the
  // micro-batches: the host sees one value per iteration.
  const auto mean_of = [&](ValueId old_id) -> absl::StatusOr<ValueId> {
    const ValueId v = remap[static_cast<size_t>(old_id)];
    const Node& producer = out.producer(v);
    if (producer.kind != NodeKind::kOp || producer.inputs.empty()) return v;
    const NodeOptions at{
        .layer_idx = producer.layer_idx, .scope = producer.scope, .name = "", .backward = producer.backward};
    ASSIGN_OR_RETURN(ValueId summed, out.AddAcc(v, num_micro_batches, at));
    ASSIGN_OR_RETURN(std::vector<ValueId> mean,
                     out.AddOp("scalar_mul", {summed}, {{"value", 1.0 / static_cast<double>(num_micro_batches)}}, at));
    return mean.front();
  };
  for (ValueId loss : graph.losses()) {
    ASSIGN_OR_RETURN(ValueId mean, mean_of(loss));
    RETURN_IF_ERROR(out.MarkLoss(mean));
  }
  for (const auto& [name, id] : graph.fetches()) {
    ASSIGN_OR_RETURN(ValueId mean, mean_of(id));
    RETURN_IF_ERROR(out.MarkFetch(name, mean));
  }
  for (const auto& [var, new_value] : graph.variable_updates()) {
    RETURN_IF_ERROR(out.SetVariableUpdate(remap[static_cast<size_t>(var)], remap[static_cast<size_t>(new_value)]));
  }

  for (const auto& [var, grad] : gradients) {
    if (!graph.IsValidValue(var) || !graph.IsValidValue(grad)) {
      return absl::InvalidArgumentError(
          StrCat("gradient accumulation: bad pair ", ValueRef(var), " -> ", ValueRef(grad)));
    }
    const Node& var_node = graph.producer(var);
    const NodeOptions at{
        .layer_idx = var_node.layer_idx, .scope = StrCat("accumulate/", graph.value(var).name), .name = ""};
    // A gradient summed across stages (a tied embedding's: the embedding's
    // on the first, the head's on the last) is accumulated per stage, and
    // the stages' sums are added once per iteration on the variable's
    // stage, rather than each micro-batch's term crossing.
    const std::vector<ValueId> terms = same_stage ? CrossStageTerms(out, remap[static_cast<size_t>(grad)], same_stage)
                                                  : std::vector<ValueId>{remap[static_cast<size_t>(grad)]};
    std::vector<std::vector<ValueId>> groups;  // terms per stage, in the sum's order
    for (ValueId term : terms) {
      auto group = std::find_if(groups.begin(), groups.end(), [&](const std::vector<ValueId>& g) {
        return same_stage(LayerOf(out, g.front()), LayerOf(out, term));
      });
      if (group == groups.end()) {
        groups.push_back({term});
      } else {
        group->push_back(term);
      }
    }
    ValueId summed = kNoValue;
    for (const std::vector<ValueId>& group : groups) {
      const NodeOptions group_at{
          .layer_idx = groups.size() == 1 ? at.layer_idx : LayerOf(out, group.front()), .scope = at.scope, .name = ""};
      ValueId partial = group.front();
      for (size_t i = 1; i < group.size(); ++i) {
        ASSIGN_OR_RETURN(std::vector<ValueId> sum, out.AddOp("add", {partial, group[i]}, {}, group_at));
        partial = sum.front();
      }
      ASSIGN_OR_RETURN(ValueId accumulated, out.AddAcc(partial, num_micro_batches, group_at));
      if (summed == kNoValue) {
        summed = accumulated;
      } else {
        ASSIGN_OR_RETURN(std::vector<ValueId> sum, out.AddOp("add", {summed, accumulated}, {}, at));
        summed = sum.front();
      }
    }
    if (root_scaled) {
      result.gradients[remap[static_cast<size_t>(var)]] = summed;
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<ValueId> mean,
                     out.AddOp("scalar_mul", {summed}, {{"value", 1.0 / static_cast<double>(num_micro_batches)}}, at));
    result.gradients[remap[static_cast<size_t>(var)]] = mean.front();
  }
  graph = std::move(out);
  return result;
}

NodeOptions ReplayOptions(const Graph& from, const Node& n) {
  return {.layer_idx = n.layer_idx,
          .scope = n.scope,
          .name = from.value(n.outputs[0]).name,
          .backward = n.backward,
          .checkpoint_segment = n.checkpoint_segment};
}

absl::StatusOr<ValueId> ReplayLeaf(const Graph& from, const Node& n, Graph& out) {
  const Value& v = from.value(n.outputs[0]);
  if (n.kind == NodeKind::kInput) {
    return out.AddInput(v.name, v.meta,
                        {.layer_idx = n.layer_idx, .scope = n.scope, .name = v.name, .backward = n.backward});
  }
  if (n.kind != NodeKind::kVariable) return absl::InternalError("ReplayLeaf: not an input or a variable");
  const VariableInfo& info = *n.variable;
  return out.AddVariable(v.name, v.meta.shape, info.init,
                         {.trainable = info.trainable,
                          .dtype = v.meta.dtype,
                          .weight_decay = info.weight_decay,
                          .placement = v.placement_hint,
                          .sbp = v.sbp_hint,
                          .layer_idx = n.layer_idx,
                          .scope = n.scope});
}

absl::Status ReplayMarks(const Graph& from, const std::vector<ValueId>& remap, Graph& out) {
  for (ValueId loss : from.losses()) RETURN_IF_ERROR(out.MarkLoss(remap[static_cast<size_t>(loss)]));
  for (const auto& [name, id] : from.fetches()) RETURN_IF_ERROR(out.MarkFetch(name, remap[static_cast<size_t>(id)]));
  for (const auto& [var, new_value] : from.variable_updates()) {
    RETURN_IF_ERROR(out.SetVariableUpdate(remap[static_cast<size_t>(var)], remap[static_cast<size_t>(new_value)]));
  }
  return absl::OkStatus();
}

GradientMap RemapGradients(const GradientMap& gradients, const std::vector<ValueId>& remap) {
  GradientMap out;
  for (const auto& [var, grad] : gradients) out[remap[static_cast<size_t>(var)]] = remap[static_cast<size_t>(grad)];
  return out;
}

absl::Status ReplayNode(const Graph& from, const Node& n, const std::vector<ValueId>& inputs, Graph& out,
                        std::vector<ValueId>& remap) {
  std::vector<ValueId> outputs;
  switch (n.kind) {
    case NodeKind::kInput:
    case NodeKind::kVariable: {
      ASSIGN_OR_RETURN(ValueId id, ReplayLeaf(from, n, out));
      outputs = {id};
      break;
    }
    case NodeKind::kRepeat:
    case NodeKind::kAcc: {
      const int64_t m = n.attrs.Int("num_micro_batches");
      const NodeOptions at = ReplayOptions(from, n);
      ASSIGN_OR_RETURN(ValueId id, n.kind == NodeKind::kRepeat ? out.AddRepeat(inputs.at(0), m, at)
                                                               : out.AddAcc(inputs.at(0), m, at));
      outputs = {id};
      break;
    }
    case NodeKind::kOp: {
      ASSIGN_OR_RETURN(outputs, out.AddOp(n.op, inputs, n.attrs, ReplayOptions(from, n)));
      break;
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    remap[static_cast<size_t>(n.outputs[i])] = outputs[i];
    const Value& old = from.value(n.outputs[i]);
    if (n.kind != NodeKind::kVariable && (old.placement_hint || old.sbp_hint)) {
      RETURN_IF_ERROR(out.SetHints(outputs[i], old.placement_hint, old.sbp_hint));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::graph
