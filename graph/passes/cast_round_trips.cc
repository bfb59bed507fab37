// Cast round trips (passes.h FoldCastRoundTrips): after autodiff under mixed
// precision, each matmul's input gradient is its f32 product cast to the
// input's low type (a gradient has its value's dtype) and then, by the
// AMP cast's gradient rule, straight back to f32. The pair rounds the
// gradient to bf16 or f16 and moves it three times; the pass has the reader
// take the f32 product instead. Only pairs of the backward pass whose
// middle value nothing else reads (nor marks as a loss, fetch or update)
// fold: a forward pair is the program's own rounding.
//
// The other direction is exact: a 16-bit gradient (the fused attention's
// dq, dk, dv) cast to f32 by the AMP cast's rule, reshaped back to the
// projection's shape, and cast to 16 bits again for that projection's
// GEMMs. The last cast's readers then read reshapes of the 16-bit value
// (views once lowered); the f32 copy stays for its other readers (the
// bias's gradient).
//
// And a cast to bf16 / f16 that is the only reader of an op's f32 output
// which the op can give in that type itself (cross_entropy_partials_grad's
// `dtype`: the logits' gradient, cast for the head's GEMMs) folds into the
// op: the same rounding, with no f32 copy written and read again.
//
// A reader that widens a 16-bit input exactly itself (reduce_sum: the
// bias's gradient of the fused attention's dq, dk, dv) reads the 16-bit
// value behind a cast to f32 and its reshapes: the same sum, with no f32
// copy written and read.
//
// Last, casts that repeat one another (the same value to the same type, on
// the same layer, both forward or both backward, in the same checkpoint
// segment: each of q, k and v's GEMMs casts the layer norm's output for
// itself) become one.

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "core/status.h"
#include "graph/passes.h"

namespace tessera::graph {
namespace {

bool IsCast(const Node& n) {
  return n.kind == NodeKind::kOp && n.op == "cast" && n.inputs.size() == 1 && n.outputs.size() == 1;
}

// `from` -> `via` -> `from` loses nothing worth keeping: f32 through a
// 16-bit float (the rounding skipped), or a 16-bit float through f32 (exact).
bool Foldable(DType from, DType via) {
  const bool low = via == DType::kBF16 || via == DType::kF16;
  return (from == DType::kF32 && low) || ((from == DType::kBF16 || from == DType::kF16) && via == DType::kF32);
}

bool IsLow(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// The ops whose output 0 can be given in a 16-bit type, and the attribute
// that asks for it.
const char* OutputDTypeAttr(const Node& n) {
  if (n.kind == NodeKind::kOp && n.op == "cross_entropy_partials_grad") return "dtype";
  return nullptr;
}

// Whether input `i` of `n` may be bf16 or f16 with the same result as the
// f32 value it widens to.
bool WidensItself(const Node& n, size_t i) { return n.kind == NodeKind::kOp && n.op == "reduce_sum" && i == 0; }

// When `value` is a cast's output behind zero or more reshapes: that cast
// and the reshapes, the one reading the cast first.
struct CastChain {
  NodeId cast = -1;
  std::vector<NodeId> reshapes;
};
CastChain CastBehindReshapes(const Graph& graph, const std::vector<NodeId>& producer, ValueId value) {
  CastChain chain;
  for (;;) {
    const NodeId p = producer[static_cast<size_t>(value)];
    if (p < 0) return {};
    const Node& n = graph.node(p);
    if (IsCast(n)) {
      chain.cast = p;
      std::reverse(chain.reshapes.begin(), chain.reshapes.end());
      return chain;
    }
    if (n.kind != NodeKind::kOp || n.op != "reshape" || n.inputs.size() != 1 || n.outputs.size() != 1) return {};
    chain.reshapes.push_back(p);
    value = n.inputs[0];
  }
}

}  // namespace

absl::StatusOr<CastRoundTripResult> FoldCastRoundTrips(Graph& graph, const GradientMap& gradients) {
  const auto values = static_cast<size_t>(graph.num_values());
  std::vector<int64_t> readers(values, 0);
  std::vector<NodeId> producer(values, -1);
  for (const Node& n : graph.nodes()) {
    for (ValueId in : n.inputs) ++readers[static_cast<size_t>(in)];
    for (ValueId out : n.outputs) producer[static_cast<size_t>(out)] = n.id;
  }
  std::vector<bool> marked(values, false);
  for (ValueId v : graph.losses()) marked[static_cast<size_t>(v)] = true;
  for (const auto& [name, v] : graph.fetches()) marked[static_cast<size_t>(v)] = true;
  for (const auto& [var, update] : graph.variable_updates()) marked[static_cast<size_t>(update)] = true;

  std::vector<bool> gradient(values, false);
  for (const auto& [var, grad] : gradients) gradient[static_cast<size_t>(grad)] = true;
  // Producers that give their output in their one reader's (a cast's) type.
  std::map<NodeId, DType> narrowed;
  for (const Node& n : graph.nodes()) {
    if (!IsCast(n)) continue;
    const auto v = static_cast<size_t>(n.inputs[0]);
    const DType to = graph.value(n.outputs[0]).meta.dtype;
    if (producer[v] < 0 || readers[v] != 1 || marked[v] || gradient[v] || !IsLow(to) ||
        graph.value(n.inputs[0]).meta.dtype != DType::kF32) {
      continue;
    }
    const Node& p = graph.node(producer[v]);
    if (OutputDTypeAttr(p) != nullptr && p.outputs[0] == n.inputs[0]) narrowed[p.id] = to;
  }

  // Casts emitted so far: (input in `out`, dtype, layer, backward, segment)
  // -> (the old output, its id in `out`).
  using CastKey = std::tuple<ValueId, DType, int64_t, bool, int64_t>;
  std::map<CastKey, std::pair<ValueId, ValueId>> emitted;
  CastRoundTripResult result;
  Graph out(&graph.registry());
  std::vector<ValueId>& remap = result.remap;
  remap.assign(values, kNoValue);
  // A 16-bit value widened to f32 behind `value`'s reshapes (16-bit ->
  // f32 -> reshapes), or no cast.
  const auto widened_low = [&](ValueId value) {
    CastChain chain = CastBehindReshapes(graph, producer, value);
    if (chain.cast >= 0) {
      const Node& cast = graph.node(chain.cast);
      if (!IsLow(graph.value(cast.inputs[0]).meta.dtype) || graph.value(cast.outputs[0]).meta.dtype != DType::kF32) {
        chain = {};
      }
    }
    return chain;
  };
  const auto low_source = [&](const CastChain& chain) {
    return graph.value(graph.node(chain.cast).inputs[0]).meta.dtype;
  };
  // The chain's reshapes again, of the 16-bit value (in `out`), each copy
  // made once; the originals stay for the f32 value's other readers.
  std::map<NodeId, ValueId> low_reshapes;
  const auto replay_on_low = [&](const CastChain& chain) -> absl::StatusOr<ValueId> {
    ValueId value = remap[static_cast<size_t>(graph.node(chain.cast).inputs[0])];
    for (NodeId r : chain.reshapes) {
      if (auto done = low_reshapes.find(r); done != low_reshapes.end()) {
        value = done->second;
        continue;
      }
      const ValueId kept = remap[static_cast<size_t>(graph.node(r).outputs[0])];
      RETURN_IF_ERROR(ReplayNode(graph, graph.node(r), {value}, out, remap));
      value = std::exchange(remap[static_cast<size_t>(graph.node(r).outputs[0])], kept);
      low_reshapes.emplace(r, value);
    }
    return value;
  };
  for (const Node& n : graph.nodes()) {
    if (auto it = narrowed.find(n.id); it != narrowed.end()) {
      Node narrow = n;
      narrow.attrs.Set(OutputDTypeAttr(n), it->second);
      std::vector<ValueId> inputs;
      for (ValueId in : n.inputs) inputs.push_back(remap[static_cast<size_t>(in)]);
      RETURN_IF_ERROR(ReplayNode(graph, narrow, inputs, out, remap));
      continue;
    }
    if (IsCast(n) && producer[static_cast<size_t>(n.inputs[0])] >= 0 &&
        narrowed.contains(producer[static_cast<size_t>(n.inputs[0])])) {
      remap[static_cast<size_t>(n.outputs[0])] = remap[static_cast<size_t>(n.inputs[0])];  // given narrowed
      ++result.folded;
      continue;
    }
    if (IsCast(n)) {
      // 16-bit -> f32 -> (reshapes) -> the same 16-bit type: the reshapes
      // again, of the 16-bit value.
      const CastChain chain = widened_low(n.inputs[0]);
      if (chain.cast >= 0 && graph.value(n.outputs[0]).meta.dtype == low_source(chain)) {
        ASSIGN_OR_RETURN(remap[static_cast<size_t>(n.outputs[0])], replay_on_low(chain));
        ++result.folded;
        continue;
      }
      const ValueId middle = n.inputs[0];
      const NodeId first = producer[static_cast<size_t>(middle)];
      // (Gradients only: a round trip in the forward pass is a program's
      // own rounding, kept; a user's graph may cast there on purpose.)
      if (first >= 0 && IsCast(graph.node(first)) && n.backward && graph.node(first).backward &&
          readers[static_cast<size_t>(middle)] == 1 && !marked[static_cast<size_t>(middle)]) {
        const ValueId source = graph.node(first).inputs[0];
        const DType from = graph.value(source).meta.dtype;
        if (graph.value(n.outputs[0]).meta.dtype == from && Foldable(from, graph.value(middle).meta.dtype)) {
          remap[static_cast<size_t>(n.outputs[0])] = remap[static_cast<size_t>(source)];
          ++result.folded;
          continue;  // (the first cast, read by no one now, is dead code)
        }
      }
    }
    std::vector<ValueId> inputs;
    for (ValueId in : n.inputs) inputs.push_back(remap[static_cast<size_t>(in)]);
    bool widened = false;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!WidensItself(n, i)) continue;
      const CastChain chain = widened_low(n.inputs[i]);
      if (chain.cast < 0) continue;
      ASSIGN_OR_RETURN(inputs[i], replay_on_low(chain));
      widened = true;
    }
    if (widened) {
      ++result.widened;
      RETURN_IF_ERROR(ReplayNode(graph, n, inputs, out, remap));
      continue;
    }
    if (IsCast(n)) {
      // The same cast of the same value, emitted again (each matmul reading
      // a layer norm's output casts it for itself): the first one's output.
      const Value& v = graph.value(n.outputs[0]);
      const CastKey key{inputs[0], v.meta.dtype, n.layer_idx, n.backward, n.checkpoint_segment};
      if (auto same = emitted.find(key); same != emitted.end()) {
        const Value& first = graph.value(same->second.first);
        if (first.placement_hint == v.placement_hint && first.sbp_hint == v.sbp_hint) {
          remap[static_cast<size_t>(n.outputs[0])] = same->second.second;
          ++result.merged;
          continue;
        }
      }
      RETURN_IF_ERROR(ReplayNode(graph, n, inputs, out, remap));
      emitted.emplace(key, std::pair{n.outputs[0], remap[static_cast<size_t>(n.outputs[0])]});
      continue;
    }
    RETURN_IF_ERROR(ReplayNode(graph, n, inputs, out, remap));
  }
  RETURN_IF_ERROR(ReplayMarks(graph, remap, out));
  result.gradients = RemapGradients(gradients, remap);
  graph = std::move(out);
  return result;
}

}  // namespace tessera::graph
