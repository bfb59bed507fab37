// Sums folded into the ops that produce a term (passes.h
// FoldAddsIntoProducers): autodiff sums the gradients a value gets from its
// readers with add. Where one term is read by nothing else, the op that
// makes it adds the other term itself, the same bits with no separate pass
// that reads both terms and writes the sum:
// - a matmul's product (q, k and v's input gradients, each dY Wᵀ of its
//   projection): matmul_add, the GEMM adding it in its epilogue, emitted at
//   the add's place;
// - a layer norm's input gradient (layer_norm_grad's dx, summed with the
//   residual stream's gradient): layer_norm_grad_add, emitted at the
//   layer_norm_grad's place, so only when the other term exists before it
//   (dgamma and dbeta may be read before the add).

#include <vector>

#include "core/status.h"
#include "graph/passes.h"

namespace tessera::graph {
namespace {

bool IsOp(const Node& n, const char* op, size_t inputs, size_t outputs) {
  return n.kind == NodeKind::kOp && n.op == op && n.inputs.size() == inputs && n.outputs.size() == outputs;
}

}  // namespace

absl::StatusOr<AddFoldResult> FoldAddsIntoProducers(Graph& graph, const GradientMap& gradients,
                                                    const SameStageFn& same_stage) {
  const auto values = static_cast<size_t>(graph.num_values());
  const auto nodes = static_cast<size_t>(graph.num_nodes());
  std::vector<bool> kept(values, false);  // marked, or a gradient the optimizer will read
  for (ValueId v : graph.losses()) kept[static_cast<size_t>(v)] = true;
  for (const auto& [name, v] : graph.fetches()) kept[static_cast<size_t>(v)] = true;
  for (const auto& [var, update] : graph.variable_updates()) kept[static_cast<size_t>(update)] = true;
  for (const auto& [var, grad] : gradients) kept[static_cast<size_t>(grad)] = true;
  // Readers among the nodes something kept needs: the cast pass leaves
  // casts nothing reads (dead code goes later), which must not count.
  // Those ops are left out of the rebuilt graph (inputs and variables stay).
  std::vector<bool> needed = kept;
  std::vector<bool> live(nodes, false);
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

  // Per add: the producer of the term it folds into, and the other term.
  std::vector<NodeId> producer_of(nodes, -1);
  std::vector<ValueId> addend_of(nodes, kNoValue);
  // Per layer_norm_grad folded: the add whose sum its dx becomes.
  std::vector<NodeId> add_of(nodes, -1);
  std::vector<bool> folded_away(nodes, false);
  AddFoldResult result;
  for (const Node& add : graph.nodes()) {
    if (!IsOp(add, "add", 2, 1) || !live[static_cast<size_t>(add.id)] || add.inputs[0] == add.inputs[1]) continue;
    const TensorMeta& meta = graph.value(add.outputs[0]).meta;
    if (meta.dtype != DType::kF32 || graph.value(add.inputs[0]).meta != meta ||
        graph.value(add.inputs[1]).meta != meta) {
      continue;
    }
    // The later of the two producers when both qualify (the other term is
    // then ready as the addend).
    NodeId best = -1;
    ValueId addend = kNoValue;
    for (int j = 0; j < 2; ++j) {
      const ValueId v = add.inputs[static_cast<size_t>(j)], other = add.inputs[static_cast<size_t>(1 - j)];
      const Value& value = graph.value(v);
      const Node& p = graph.producer(v);
      if (folded_away[static_cast<size_t>(p.id)] || readers[static_cast<size_t>(v)] != 1 ||
          kept[static_cast<size_t>(v)] || value.sbp_hint || value.placement_hint || p.backward != add.backward ||
          p.checkpoint_segment != add.checkpoint_segment) {
        continue;
      }
      // A product folds where the add is, on its layer (the GEMM's inputs
      // are there). A layer norm's gradient folds where it is, on its own
      // layer: the sum of a layer's input gradient is the previous layer's
      // node, and at a stage boundary one term crosses either way.
      // Not with a term made on another pipeline stage: that sum is a
      // weight's gradient over stages (a tied weight read by a matmul on its
      // own stage), which gradient accumulation sums per stage
      // (AccumulateGradients) rather than crossing each micro-batch's term.
      bool across_stages = false;
      if (same_stage && add.layer_idx != kUnassignedLayer) {
        const std::vector<ValueId> terms = SumTerms(graph, other);
        across_stages = terms.empty();  // too many to tell: leave the sum alone
        for (ValueId term : terms) {
          const int64_t layer = graph.producer(term).layer_idx;
          across_stages = across_stages || (layer != kUnassignedLayer && !same_stage(layer, add.layer_idx));
        }
      }
      const bool product = IsOp(p, "matmul", 2, 1) && p.layer_idx == add.layer_idx && !across_stages;
      const bool norm_grad =
          IsOp(p, "layer_norm_grad", 5, 3) && p.outputs[0] == v && graph.value(other).producer < p.id;
      if ((product || norm_grad) && p.id > best) {
        best = p.id;
        addend = other;
      }
    }
    if (best < 0) continue;
    producer_of[static_cast<size_t>(add.id)] = best;
    addend_of[static_cast<size_t>(add.id)] = addend;
    folded_away[static_cast<size_t>(best)] = true;
    if (graph.node(best).op == "layer_norm_grad") add_of[static_cast<size_t>(best)] = add.id;
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
  const auto remapped = [&remap](const std::vector<ValueId>& ids) {
    std::vector<ValueId> mapped;
    for (ValueId id : ids) mapped.push_back(remap[static_cast<size_t>(id)]);
    return mapped;
  };
  for (const Node& n : graph.nodes()) {
    if (!live[static_cast<size_t>(n.id)]) continue;  // dead: may read a folded term
    if (const NodeId add = add_of[static_cast<size_t>(n.id)]; add >= 0) {
      // layer_norm_grad_add at the layer_norm_grad's place: its dx is the
      // add's sum (with the add's hints); dgamma and dbeta stay.
      const Node& sum = graph.node(add);
      Node fused = n;
      fused.op = "layer_norm_grad_add";
      fused.inputs.push_back(addend_of[static_cast<size_t>(add)]);
      fused.outputs[0] = sum.outputs[0];
      RETURN_IF_ERROR(ReplayNode(graph, fused, remapped(fused.inputs), out, remap));
      continue;
    }
    const NodeId folded = producer_of[static_cast<size_t>(n.id)];
    if (folded >= 0 && graph.node(folded).op == "layer_norm_grad") continue;  // made at the layer_norm_grad
    if (folded >= 0) {
      // matmul_add at the add's place, with the matmul's attributes.
      const Node& product = graph.node(folded);
      Node fused = n;
      fused.op = "matmul_add";
      fused.attrs = product.attrs;  // transpose_a, transpose_b, alpha
      fused.inputs = {product.inputs[0], product.inputs[1], addend_of[static_cast<size_t>(n.id)]};
      RETURN_IF_ERROR(ReplayNode(graph, fused, remapped(fused.inputs), out, remap));
      continue;
    }
    if (folded_away[static_cast<size_t>(n.id)]) continue;  // a matmul: made at its add
    RETURN_IF_ERROR(ReplayNode(graph, n, remapped(n.inputs), out, remap));
  }
  RETURN_IF_ERROR(ReplayMarks(graph, remap, out));
  result.gradients = RemapGradients(gradients, remap);
  graph = std::move(out);
  return result;
}

}  // namespace tessera::graph
