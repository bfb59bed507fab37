// ZeRO-3's graph pass: each reader of a trained variable gets its own copy,
// made once the reader's other input exists.

#include <set>

#include "core/status.h"
#include "core/text.h"
#include "graph/passes.h"

namespace tessera::graph {

absl::StatusOr<GatherPerReaderResult> GatherPerReader(Graph& graph, const GradientMap& gradients) {
  GatherPerReaderResult result;
  // Trained variables and the repeats of them (gradient accumulation).
  std::set<ValueId> trained;
  for (const auto& [var, grad] : gradients) {
    if (!graph.IsValidValue(var) || !graph.IsVariable(var) || !graph.IsValidValue(grad)) {
      return absl::InvalidArgumentError(StrCat("ZeRO-3: bad gradient pair ", ValueRef(var), " -> ", ValueRef(grad)));
    }
    trained.insert(var);
  }
  for (const Node& n : graph.nodes()) {
    if (n.kind == NodeKind::kRepeat && trained.contains(n.inputs[0])) trained.insert(n.outputs[0]);
  }

  Graph out(&graph.registry());
  std::vector<ValueId>& remap = result.remap;
  remap.assign(static_cast<size_t>(graph.num_values()), kNoValue);
  for (const Node& n : graph.nodes()) {
    // The first input that is not a trained variable: what the copies wait for.
    ValueId after = kNoValue;
    for (ValueId in : n.inputs) {
      if (!trained.contains(in)) {
        after = in;
        break;
      }
    }
    std::map<ValueId, ValueId> held;  // trained variable -> its copy for this reader
    std::vector<ValueId> inputs;
    for (ValueId in : n.inputs) {
      if (n.kind != NodeKind::kOp || after == kNoValue || !trained.contains(in)) {
        inputs.push_back(remap[static_cast<size_t>(in)]);
        continue;
      }
      auto it = held.find(in);
      if (it == held.end()) {
        ASSIGN_OR_RETURN(
            std::vector<ValueId> copy,
            out.AddOp(
                "depend", {remap[static_cast<size_t>(in)], remap[static_cast<size_t>(after)]}, {},
                {.layer_idx = n.layer_idx, .scope = StrCat("zero3/", n.scope), .name = "", .backward = n.backward}));
        it = held.emplace(in, copy.front()).first;
        ++result.copies;
      }
      inputs.push_back(it->second);
    }
    RETURN_IF_ERROR(ReplayNode(graph, n, inputs, out, remap));
  }
  RETURN_IF_ERROR(ReplayMarks(graph, remap, out));
  result.gradients = RemapGradients(gradients, remap);
  graph = std::move(out);
  return result;
}

}  // namespace tessera::graph
