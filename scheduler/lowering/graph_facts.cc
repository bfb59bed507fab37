#include "scheduler/lowering/graph_facts.h"

#include <algorithm>
#include <map>
#include <variant>

#include "core/status.h"
#include "core/text.h"

namespace tessera::scheduler::lowering {
namespace {

using graph::Graph;
using graph::Node;
using graph::NodeId;
using graph::NodeKind;
using graph::ValueId;

const char* RateName(Rate rate) {
  switch (rate) {
    case Rate::kIteration: return "once per iteration";
    case Rate::kMicroBatch: return "once per micro-batch";
    case Rate::kUnknown: break;
  }
  return "at no known rate";
}

// How each micro-batch-rate value's tensor of the whole iteration is laid
// out over the m micro-batches, as an SBP over a virtual axis of m parts:
// data inputs are S(0) (the trainer feeds rows [k·b, (k+1)·b)), repeat and
// constants B, and every op takes the first SBP signature (for the
// iteration-level shapes) whose inputs match its inputs' layouts, so a
// transpose moves S(0) to S(1) and a reduction over the batch gives P.
// nullopt where no signature matches (the layout is unknown).
//
// A random op's draws are keyed by (seed, tensor_id); a backward op with
// the key of a forward one (dropout's gradient, attention's) draws the
// forward's numbers on a gradient of the forward's shape. A gradient lies
// over the micro-batches as its primal does (micro-batch k's gradient is
// the iteration's gradient's part k), so where inference leaves such an
// input unknown (a loss normalised per micro-batch, e.g. by its own count of
// masked tokens, has no S/B/P layout, nor has anything downstream of it)
// it takes the layout the same-keyed op's values of its shape have, when
// they agree on one.
std::vector<std::optional<Sbp>> InferMicroLayouts(const Graph& graph, const Rates& rates) {
  std::vector<std::optional<Sbp>> layout(static_cast<size_t>(graph.num_values()));
  const int64_t m = rates.num_micro_batches;
  if (m <= 1) return layout;
  const auto micro = [&](ValueId v) { return rates.value[static_cast<size_t>(v)] == Rate::kMicroBatch; };
  // (seed, tensor_id) -> the layouts of the micro-batch values of each shape
  // that random ops with that key read or write (several: ambiguous).
  std::map<std::pair<int64_t, int64_t>, std::map<std::vector<int64_t>, std::vector<Sbp>>> drawn;
  const auto draw_key = [&](const Node& node) -> std::optional<std::pair<int64_t, int64_t>> {
    const ops::OpSchema* schema = node.kind == NodeKind::kOp ? graph.schema(node) : nullptr;
    if (schema == nullptr || !schema->Draws(node.attrs)) return std::nullopt;
    const ops::AttrValue* seed = node.attrs.Find("seed");
    const ops::AttrValue* tensor_id = node.attrs.Find("tensor_id");
    if (seed == nullptr || tensor_id == nullptr || !std::holds_alternative<int64_t>(*seed) ||
        !std::holds_alternative<int64_t>(*tensor_id)) {
      return std::nullopt;
    }
    return std::pair{std::get<int64_t>(*seed), std::get<int64_t>(*tensor_id)};
  };
  const auto dims = [&](ValueId v) { return graph.value(v).meta.shape.dims(); };
  for (const Node& node : graph.nodes()) {
    const auto set_all = [&](const std::optional<Sbp>& sbp) {
      for (ValueId out : node.outputs) layout[static_cast<size_t>(out)] = micro(out) ? sbp : std::optional<Sbp>(Sbp::Broadcast());
    };
    switch (node.kind) {
      case NodeKind::kInput: {
        const bool batched = !node.outputs.empty() && graph.value(node.outputs[0]).meta.shape.rank() > 0;
        set_all(batched ? Sbp::Split(0) : Sbp::Broadcast());
        continue;
      }
      case NodeKind::kVariable:
      case NodeKind::kRepeat:
      case NodeKind::kAcc:
        set_all(Sbp::Broadcast());
        continue;
      case NodeKind::kOp:
        break;
    }
    const std::optional<std::pair<int64_t, int64_t>> key = draw_key(node);
    if (key && drawn.contains(*key)) {
      for (ValueId in : node.inputs) {
        if (layout[static_cast<size_t>(in)] || !micro(in)) continue;
        const auto& by_shape = drawn.at(*key);
        const auto it = by_shape.find(dims(in));
        if (it != by_shape.end() && it->second.size() == 1) layout[static_cast<size_t>(in)] = it->second[0];
      }
    }
    std::vector<Sbp> inputs;
    std::vector<TensorMeta> metas;
    bool known = true;
    for (ValueId in : node.inputs) {
      const std::optional<Sbp>& sbp = layout[static_cast<size_t>(in)];
      if (!sbp) known = false;
      inputs.push_back(sbp.value_or(Sbp::Broadcast()));
      TensorMeta meta = graph.value(in).meta;
      if (sbp && sbp->is_split() && sbp->axis() < meta.shape.rank()) {
        int64_t extent = 0;
        if (__builtin_mul_overflow(meta.shape[sbp->axis()], m, &extent)) known = false;
        meta.shape[sbp->axis()] = extent;
      }
      metas.push_back(std::move(meta));
    }
    const ops::OpSchema* schema = graph.schema(node);
    std::optional<std::vector<Sbp>> outputs;
    if (node.inputs.empty()) {
      outputs = std::vector<Sbp>(node.outputs.size(), Sbp::Broadcast());  // a constant: the same every micro-batch
    } else if (known && schema != nullptr) {
      // The signatures are asked of the iteration's shapes. An op whose
      // "shape" attribute gives its output shape (reshape, broadcast_to) is
      // asked once per output axis the micro-batches may lie along, with
      // that extent of the attribute scaled to match.
      std::vector<std::pair<ops::AttrMap, int>> variants = {{node.attrs, -1}};
      if (const ops::AttrValue* shape = node.attrs.Find("shape"); shape != nullptr && std::holds_alternative<std::vector<int64_t>>(*shape)) {
        const std::vector<int64_t>& dims = std::get<std::vector<int64_t>>(*shape);
        for (size_t b = 0; b < dims.size(); ++b) {
          int64_t scaled = 0;
          if (dims[b] <= 0 || __builtin_mul_overflow(dims[b], m, &scaled)) continue;
          std::vector<int64_t> iteration = dims;
          iteration[b] = scaled;
          ops::AttrMap attrs = node.attrs;
          attrs.Set("shape", iteration);
          variants.emplace_back(std::move(attrs), static_cast<int>(b));
        }
      }
      for (const auto& [attrs, axis] : variants) {
        if (!schema->InferMeta(metas, attrs).ok()) continue;  // not this op's iteration-level shapes
        for (const ops::SbpSignature& sig : schema->SbpSignatures(metas, attrs, m)) {
          if (sig.inputs != inputs || sig.outputs.size() != node.outputs.size()) continue;
          if (axis >= 0 && !(sig.outputs[0].is_split() && sig.outputs[0].axis() == axis)) continue;
          outputs = sig.outputs;
          break;
        }
        if (outputs) break;
      }
    }
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const ValueId out = node.outputs[k];
      if (!micro(out)) {
        layout[static_cast<size_t>(out)] = Sbp::Broadcast();
      } else if (outputs) {
        layout[static_cast<size_t>(out)] = (*outputs)[k];
      }
    }
    if (key && outputs) {
      for (const std::vector<ValueId>* values : {&node.inputs, &node.outputs}) {
        for (ValueId v : *values) {
          const std::optional<Sbp>& sbp = layout[static_cast<size_t>(v)];
          if (!micro(v) || !sbp) continue;
          std::vector<Sbp>& seen = drawn[*key][dims(v)];
          if (std::find(seen.begin(), seen.end(), *sbp) == seen.end()) seen.push_back(*sbp);
        }
      }
    }
  }
  return layout;
}

}  // namespace

absl::StatusOr<Rates> InferRates(const Graph& graph) {
  Rates rates;
  for (const Node& node : graph.nodes()) {
    if (node.kind != NodeKind::kRepeat && node.kind != NodeKind::kAcc) continue;
    const int64_t m = node.attrs.Int("num_micro_batches");
    if (rates.num_micro_batches != 1 && rates.num_micro_batches != m) {
      return absl::InvalidArgumentError(StrCat("scheduler: ", node.op, " node ", node.id, " has ", m,
                                               " micro-batches, another node ", rates.num_micro_batches));
    }
    rates.num_micro_batches = m;
  }
  const size_t num_values = static_cast<size_t>(graph.num_values());
  rates.value.assign(num_values, Rate::kUnknown);
  if (rates.num_micro_batches == 1) {
    rates.value.assign(num_values, Rate::kIteration);
    return rates;
  }
  auto& rate = rates.value;
  const auto from_inputs = [&](const Node& node) {
    Rate r = Rate::kUnknown;
    for (ValueId in : node.inputs) {
      if (rate[static_cast<size_t>(in)] == Rate::kMicroBatch) return Rate::kMicroBatch;
      if (rate[static_cast<size_t>(in)] == Rate::kIteration) r = Rate::kIteration;
    }
    return r;
  };
  const auto set_outputs = [&](const Node& node, Rate r) {
    for (ValueId v : node.outputs) rate[static_cast<size_t>(v)] = r;
  };
  // Forward: variables and acc give iteration-rate values, repeat
  // micro-batch ones; ops follow their inputs; graph inputs are open.
  const auto forward = [&]() {
    for (const Node& node : graph.nodes()) {
      switch (node.kind) {
        case NodeKind::kVariable: set_outputs(node, Rate::kIteration); break;
        case NodeKind::kRepeat: set_outputs(node, Rate::kMicroBatch); break;
        case NodeKind::kAcc: set_outputs(node, Rate::kIteration); break;
        case NodeKind::kOp: set_outputs(node, from_inputs(node)); break;
        case NodeKind::kInput: break;
      }
    }
  };
  forward();
  // A graph input runs at the rate of the ops reading it (data: micro-batch;
  // the learning rate: iteration); one read by nothing decided is data.
  std::vector<std::vector<NodeId>> readers(num_values);
  for (const Node& node : graph.nodes()) {
    for (ValueId in : node.inputs) readers[static_cast<size_t>(in)].push_back(node.id);
  }
  for (const Node& node : graph.nodes()) {
    if (node.kind != NodeKind::kInput) continue;
    Rate r = Rate::kUnknown;
    for (NodeId reader : readers[static_cast<size_t>(node.outputs[0])]) {
      const Node& n = graph.node(reader);
      const Rate rr = n.outputs.empty() ? Rate::kUnknown : rate[static_cast<size_t>(n.outputs[0])];
      if (rr == Rate::kMicroBatch || n.kind == NodeKind::kAcc) r = Rate::kMicroBatch;
      if (rr == Rate::kIteration && r == Rate::kUnknown && n.kind != NodeKind::kRepeat) r = Rate::kIteration;
    }
    set_outputs(node, r == Rate::kUnknown ? Rate::kMicroBatch : r);
  }
  forward();
  // What is still open descends from constants only: it runs at its
  // readers' rate (resolved in reverse order, readers first).
  for (NodeId id = graph.num_nodes() - 1; id >= 0; --id) {
    const Node& node = graph.node(id);
    if (node.outputs.empty() || rate[static_cast<size_t>(node.outputs[0])] != Rate::kUnknown) continue;
    Rate r = Rate::kUnknown;
    for (ValueId v : node.outputs) {
      for (NodeId reader : readers[static_cast<size_t>(v)]) {
        const Node& n = graph.node(reader);
        Rate rr = n.outputs.empty() ? Rate::kIteration : rate[static_cast<size_t>(n.outputs[0])];
        if (n.kind == NodeKind::kRepeat) rr = Rate::kIteration;
        if (n.kind == NodeKind::kAcc) rr = Rate::kMicroBatch;
        if (r != Rate::kUnknown && rr != r) {
          return absl::UnimplementedError(StrCat("scheduler: constant ", node.op, " (node ", node.id,
                                                 ") is read both once per iteration and once per micro-batch"));
        }
        r = rr;
      }
    }
    set_outputs(node, r == Rate::kUnknown ? Rate::kIteration : r);
  }
  // Every op reads values of its own rate; repeat turns iteration-rate into
  // micro-batch-rate values and acc back.
  for (const Node& node : graph.nodes()) {
    if (node.inputs.empty()) continue;
    Rate want = node.outputs.empty() ? Rate::kIteration : rate[static_cast<size_t>(node.outputs[0])];
    if (node.kind == NodeKind::kRepeat) want = Rate::kIteration;
    if (node.kind == NodeKind::kAcc) want = Rate::kMicroBatch;
    for (ValueId in : node.inputs) {
      if (rate[static_cast<size_t>(in)] != want) {
        const graph::Value& v = graph.value(in);
        return absl::UnimplementedError(StrCat("scheduler: ", node.op, " (node ", node.id, node.scope.empty() ? "" : StrCat(", ", node.scope),
                                               ") runs ", RateName(want), " but reads '", v.name.empty() ? graph::ValueRef(in) : v.name,
                                               "', produced ", RateName(rate[static_cast<size_t>(in)])));
      }
    }
  }
  return rates;
}


absl::StatusOr<GraphFacts> CollectGraphFacts(const Graph& graph, Rates rates) {
  GraphFacts facts;
  // Update nodes: variable -> the op node that updates it in place; state
  // variables -> (owning variable, state index).
  const auto& updates = graph.variable_updates();
  for (const auto& [var, new_value] : updates) {
    const Node& producer = graph.producer(new_value);
    if (producer.kind != NodeKind::kOp || producer.inputs.empty()) {
      return absl::UnimplementedError(StrCat("scheduler: the update of variable '", graph.value(var).name,
                                             "' is not an op output"));
    }
    const ValueId owner = producer.inputs[0];
    if (!graph.IsVariable(owner) || !updates.contains(owner) || updates.at(owner) != producer.outputs[0]) {
      return absl::UnimplementedError(StrCat("scheduler: the update of variable '", graph.value(var).name, "' (op ",
                                             producer.op, ") is not an in-place update of its input 0"));
    }
    facts.update_owner[producer.id] = owner;
  }
  std::map<ValueId, ValueId> updated_by;  // new value -> the variable it updates
  for (const auto& [var, new_value] : updates) updated_by[new_value] = var;
  for (const auto& [node_id, owner] : facts.update_owner) {
    const Node& node = graph.node(node_id);
    for (size_t k = 1; k < node.outputs.size(); ++k) {
      const auto it = updated_by.find(node.outputs[k]);
      if (it == updated_by.end()) continue;
      const ValueId state = it->second;
      if (state == owner || std::find(node.inputs.begin(), node.inputs.end(), state) == node.inputs.end()) {
        return absl::UnimplementedError(StrCat("scheduler: output ", k, " of ", node.op, " updates '",
                                               graph.value(state).name, "', which it does not read"));
      }
      facts.state_of[state] = {owner, static_cast<int32_t>(k - 1)};
    }
  }
  // State variables belong to their owner's task: nothing else may read them.
  for (const Node& node : graph.nodes()) {
    if (node.kind != NodeKind::kOp || facts.update_owner.contains(node.id)) continue;
    for (ValueId in : node.inputs) {
      if (facts.state_of.contains(in)) {
        return absl::UnimplementedError(StrCat("scheduler: optimizer state '", graph.value(in).name,
                                               "' is read by ", node.op, " (node ", node.id, ")"));
      }
    }
  }
  for (const auto& [state, owner_index] : facts.state_of) {
    facts.states_of_owner[owner_index.first].emplace_back(state, owner_index.second);
  }

  // The sink reads the losses and fetches.
  for (size_t i = 0; i < graph.losses().size(); ++i) {
    facts.sinks.emplace_back(i == 0 ? std::string("loss") : StrCat("loss", i), graph.losses()[i]);
  }
  for (const auto& fetch : graph.fetches()) facts.sinks.push_back(fetch);
  for (const auto& [name, value] : facts.sinks) {
    if (facts.state_of.contains(value)) return absl::UnimplementedError(StrCat("scheduler: cannot fetch optimizer state '", name, "'"));
    if (rates.value[static_cast<size_t>(value)] != Rate::kIteration) {
      return absl::UnimplementedError(StrCat("scheduler: '", name, "' is computed once per micro-batch; fetch its mean over the ",
                                             "micro-batches (gradient accumulation averages losses and fetches)"));
    }
  }

  facts.micro_layout = InferMicroLayouts(graph, rates);
  facts.rates = std::move(rates);

  for (const Node& node : graph.nodes()) {
    if (node.kind == NodeKind::kOp || node.kind == NodeKind::kRepeat || node.kind == NodeKind::kAcc) {
      for (ValueId in : node.inputs) facts.read.insert(in);
    }
  }
  for (const auto& [name, value] : facts.sinks) facts.read.insert(value);
  for (const Node& node : graph.nodes()) {
    if (!node.backward) continue;
    for (ValueId in : node.inputs) {
      if (!graph.producer(in).backward) facts.kept_for_backward.insert(in);
    }
  }
  facts.epoch.assign(static_cast<size_t>(graph.num_values()), 0);
  facts.backward.assign(static_cast<size_t>(graph.num_values()), false);
  for (const Node& node : graph.nodes()) {  // topological
    int32_t epoch = 0;
    bool backward = node.backward;
    for (ValueId in : node.inputs) {
      epoch = std::max(epoch, facts.epoch[static_cast<size_t>(in)]);
      backward = backward || facts.backward[static_cast<size_t>(in)];
    }
    if (node.kind == NodeKind::kAcc) ++epoch;
    for (ValueId out : node.outputs) {
      facts.epoch[static_cast<size_t>(out)] = epoch;
      facts.backward[static_cast<size_t>(out)] = backward;
    }
  }
  return facts;
}

}  // namespace tessera::scheduler::lowering
