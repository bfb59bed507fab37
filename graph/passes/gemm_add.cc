// Sums folded into GEMMs (passes.h FoldAddsIntoGemms): autodiff sums the
// gradients a value gets from its readers with add; where one term is a
// matmul's product that nothing else reads (q, k and v's input gradients,
// each dY Wᵀ of its projection), the matmul adds the other term in its
// epilogue (matmul_add): the same bits, with no separate pass that reads
// both terms and writes the sum.

#include <vector>

#include "core/status.h"
#include "graph/passes.h"

namespace tessera::graph {
namespace {

bool IsOp(const Node& n, const char* op, size_t inputs) {
  return n.kind == NodeKind::kOp && n.op == op && n.inputs.size() == inputs && n.outputs.size() == 1;
}

}  // namespace

absl::StatusOr<GemmAddResult> FoldAddsIntoGemms(Graph& graph, const GradientMap& gradients) {
  const auto values = static_cast<size_t>(graph.num_values());
  std::vector<bool> kept(values, false);  // marked, or a gradient the optimizer will read
  for (ValueId v : graph.losses()) kept[static_cast<size_t>(v)] = true;
  for (const auto& [name, v] : graph.fetches()) kept[static_cast<size_t>(v)] = true;
  for (const auto& [var, update] : graph.variable_updates()) kept[static_cast<size_t>(update)] = true;
  for (const auto& [var, grad] : gradients) kept[static_cast<size_t>(grad)] = true;
  // Readers among the nodes something kept needs: the cast pass leaves
  // casts nothing reads (dead code goes later), which must not count.
  // Those ops are left out of the rebuilt graph (inputs and variables stay).
  std::vector<bool> needed = kept;
  std::vector<bool> live(static_cast<size_t>(graph.num_nodes()), false);
  std::vector<int64_t> readers(values, 0);
  for (auto n = graph.nodes().rbegin(); n != graph.nodes().rend(); ++n) {
    bool is_live = n->kind != NodeKind::kOp;
    for (ValueId out : n->outputs) is_live = is_live || needed[static_cast<size_t>(out)];
    if (!is_live) continue;
    live[static_cast<size_t>(n->id)] = true;
    for (ValueId in : n->inputs) {
      needed[static_cast<size_t>(in)] = true;
      ++readers[static_cast<size_t>(in)];
    }
  }

  // add node -> (its matmul term's producer, the other term's operand index).
  std::vector<NodeId> gemm_of(static_cast<size_t>(graph.num_nodes()), -1);
  std::vector<int> addend_of(static_cast<size_t>(graph.num_nodes()), 0);
  std::vector<bool> folded_away(static_cast<size_t>(graph.num_nodes()), false);
  GemmAddResult result;
  for (const Node& add : graph.nodes()) {
    if (!IsOp(add, "add", 2) || !live[static_cast<size_t>(add.id)]) continue;
    const TensorMeta& meta = graph.value(add.outputs[0]).meta;
    if (meta.dtype != DType::kF32 || graph.value(add.inputs[0]).meta != meta ||
        graph.value(add.inputs[1]).meta != meta) {
      continue;
    }
    // The later of the two products when both are (the other is then ready
    // as its addend).
    NodeId best = -1;
    int addend = 0;
    for (int j = 0; j < 2; ++j) {
      const ValueId v = add.inputs[static_cast<size_t>(j)];
      const Value& value = graph.value(v);
      const Node& p = graph.producer(v);
      if (!IsOp(p, "matmul", 2) || readers[static_cast<size_t>(v)] != 1 || kept[static_cast<size_t>(v)] ||
          value.sbp_hint || value.placement_hint || p.layer_idx != add.layer_idx || p.backward != add.backward ||
          p.checkpoint_segment != add.checkpoint_segment || add.inputs[0] == add.inputs[1]) {
        continue;
      }
      if (p.id > best) {
        best = p.id;
        addend = 1 - j;
      }
    }
    if (best < 0) continue;
    gemm_of[static_cast<size_t>(add.id)] = best;
    addend_of[static_cast<size_t>(add.id)] = addend;
    folded_away[static_cast<size_t>(best)] = true;
    ++result.folded;
  }
  if (result.folded == 0) {
    result.gradients = gradients;
    result.remap.resize(values);
    for (size_t v = 0; v < values; ++v) result.remap[v] = static_cast<ValueId>(v);
    return result;
  }

  Graph out(&graph.registry());
  std::vector<ValueId>& remap = result.remap;
  remap.assign(values, kNoValue);
  for (const Node& n : graph.nodes()) {
    // Folded ones are emitted at their add; dead ones may read a folded
    // product.
    if (folded_away[static_cast<size_t>(n.id)] || !live[static_cast<size_t>(n.id)]) continue;
    std::vector<ValueId> inputs;
    const NodeId gemm = gemm_of[static_cast<size_t>(n.id)];
    if (gemm < 0) {
      for (ValueId in : n.inputs) inputs.push_back(remap[static_cast<size_t>(in)]);
      RETURN_IF_ERROR(ReplayNode(graph, n, inputs, out, remap));
      continue;
    }
    const Node& product = graph.node(gemm);
    Node fused = n;  // the add's place and output (with its hints)
    fused.op = "matmul_add";
    fused.attrs = product.attrs;  // transpose_a, transpose_b, alpha
    inputs = {remap[static_cast<size_t>(product.inputs[0])], remap[static_cast<size_t>(product.inputs[1])],
              remap[static_cast<size_t>(n.inputs[static_cast<size_t>(addend_of[static_cast<size_t>(n.id)])])]};
    RETURN_IF_ERROR(ReplayNode(graph, fused, inputs, out, remap));
  }
  RETURN_IF_ERROR(ReplayMarks(graph, remap, out));
  result.gradients = RemapGradients(gradients, remap);
  graph = std::move(out);
  return result;
}

}  // namespace tessera::graph
