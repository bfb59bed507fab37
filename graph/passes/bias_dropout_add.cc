// Bias, dropout and residual add as one op (passes.h FuseBiasDropoutAdd):
// a row-parallel projection adds its bias after its all-reduce, drops the
// result out, and the layer adds it to the residual stream: three passes
// over (B·T, C) in forward, each writing a tensor the next one reads once.
// bias_dropout_add does the same operations in the same order in one pass,
// and its gradient is the three ops' gradients (ops/random.cc).

#include <vector>

#include "core/status.h"
#include "graph/passes.h"

namespace tessera::graph {
namespace {

bool IsOp(const Node& n, const char* op, size_t inputs) {
  return n.kind == NodeKind::kOp && n.op == op && n.inputs.size() == inputs && n.outputs.size() == 1;
}

}  // namespace

absl::StatusOr<BiasDropoutAddResult> FuseBiasDropoutAdd(Graph& graph) {
  for (const Node& n : graph.nodes()) {
    if (n.backward || n.kind == NodeKind::kRepeat || n.kind == NodeKind::kAcc) {
      return absl::FailedPreconditionError("the bias-dropout-add fusion runs on the forward graph, before autodiff");
    }
  }
  const auto values = static_cast<size_t>(graph.num_values());
  std::vector<int64_t> readers(values, 0);
  for (const Node& n : graph.nodes()) {
    for (ValueId in : n.inputs) ++readers[static_cast<size_t>(in)];
  }
  std::vector<bool> marked(values, false);
  for (ValueId v : graph.losses()) marked[static_cast<size_t>(v)] = true;
  for (const auto& [name, v] : graph.fetches()) marked[static_cast<size_t>(v)] = true;
  for (const auto& [var, update] : graph.variable_updates()) marked[static_cast<size_t>(update)] = true;
  // A value only the next op of the chain reads: nothing else needs it, and
  // no hint asks for a layout of it.
  const auto internal = [&](ValueId v) {
    const Value& value = graph.value(v);
    return readers[static_cast<size_t>(v)] == 1 && !marked[static_cast<size_t>(v)] && !value.sbp_hint &&
           !value.placement_hint;
  };
  // The chains: add node -> (bias_add, dropout or -1, the residual's operand).
  struct Chain {
    NodeId bias_add = -1, dropout = -1;
    std::vector<NodeId> reshapes;
    int residual = 0;
  };
  std::vector<Chain> chain_of(static_cast<size_t>(graph.num_nodes()));
  std::vector<bool> fused_away(static_cast<size_t>(graph.num_nodes()), false);
  BiasDropoutAddResult result;
  for (const Node& add : graph.nodes()) {
    if (!IsOp(add, "add", 2) || graph.value(add.inputs[0]).meta != graph.value(add.inputs[1]).meta) continue;
    for (int j = 0; j < 2; ++j) {
      ValueId v = add.inputs[static_cast<size_t>(j)];
      if (!internal(v)) continue;
      Chain chain;
      chain.residual = 1 - j;
      // Reshapes (views) may stand anywhere in the chain (a projection's
      // (B·T, C) back to (B, T, C)): the elements keep their row-major
      // order, so the dropout's mask by global index is the same on the
      // add's shape, and the bias stays on the last axis.
      const auto skip_reshapes = [&](ValueId value, bool& ok) {
        const Node* p = &graph.producer(value);
        while (ok && IsOp(*p, "reshape", 1)) {
          chain.reshapes.push_back(p->id);
          value = p->inputs[0];
          ok = internal(value);
          p = &graph.producer(value);
        }
        return p;
      };
      bool ok = true;
      const Node* p = skip_reshapes(v, ok);
      if (ok && IsOp(*p, "dropout", 1)) {
        chain.dropout = p->id;
        ok = internal(p->inputs[0]);
        p = skip_reshapes(p->inputs[0], ok);
      }
      if (!ok || !IsOp(*p, "bias_add", 2)) continue;
      const Shape& shape = graph.value(add.inputs[0]).meta.shape;
      if (graph.value(p->outputs[0]).meta.dtype != DType::kF32 ||
          graph.value(p->inputs[1]).meta.shape != Shape{shape[shape.rank() - 1]}) {
        continue;
      }
      chain.bias_add = p->id;
      // One layer, one checkpoint segment: the fused op stands where the
      // three did for pipeline stages and recomputation.
      bool same_place = true;
      std::vector<NodeId> members = chain.reshapes;
      members.push_back(chain.bias_add);
      if (chain.dropout >= 0) members.push_back(chain.dropout);
      for (NodeId id : members) {
        const Node& m = graph.node(id);
        same_place = same_place && m.layer_idx == add.layer_idx && m.checkpoint_segment == add.checkpoint_segment;
      }
      if (!same_place) continue;
      for (NodeId id : members) fused_away[static_cast<size_t>(id)] = true;
      chain_of[static_cast<size_t>(add.id)] = std::move(chain);
      ++result.fused;
      break;
    }
  }
  if (result.fused == 0) return result;

  Graph out(&graph.registry());
  std::vector<ValueId>& remap = result.remap;
  remap.assign(values, kNoValue);
  for (const Node& n : graph.nodes()) {
    if (fused_away[static_cast<size_t>(n.id)]) continue;  // read only by its chain's add
    const Chain& chain = chain_of[static_cast<size_t>(n.id)];
    if (chain.bias_add < 0) {
      std::vector<ValueId> inputs;
      for (ValueId in : n.inputs) inputs.push_back(remap[static_cast<size_t>(in)]);
      RETURN_IF_ERROR(ReplayNode(graph, n, inputs, out, remap));
      continue;
    }
    const Node& bias_add = graph.node(chain.bias_add);
    const NodeOptions place{.layer_idx = n.layer_idx, .scope = n.scope, .checkpoint_segment = n.checkpoint_segment};
    ValueId x = remap[static_cast<size_t>(bias_add.inputs[0])];
    const Shape& shape = graph.value(n.outputs[0]).meta.shape;
    if (out.value(x).meta.shape != shape) {
      ASSIGN_OR_RETURN(std::vector<ValueId> viewed, out.AddOp("reshape", {x}, {{"shape", shape.dims()}}, place));
      x = viewed.front();
    }
    Node fused = n;  // the add's place, scope and output (with its hints)
    fused.op = "bias_dropout_add";
    if (chain.dropout >= 0) {
      fused.attrs = graph.node(chain.dropout).attrs;  // rate, seed, tensor_id
    } else {
      fused.attrs = {{"rate", 0.0}, {"seed", int64_t{0}}, {"tensor_id", int64_t{0}}};
    }
    const std::vector<ValueId> inputs = {x, remap[static_cast<size_t>(bias_add.inputs[1])],
                                         remap[static_cast<size_t>(n.inputs[static_cast<size_t>(chain.residual)])]};
    RETURN_IF_ERROR(ReplayNode(graph, fused, inputs, out, remap));
  }
  RETURN_IF_ERROR(ReplayMarks(graph, remap, out));
  graph = std::move(out);
  return result;
}

}  // namespace tessera::graph
