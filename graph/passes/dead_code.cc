// Dead-code elimination: keep what the roots need, drop the rest.

#include "core/status.h"
#include "graph/passes.h"

namespace tessera::graph {

absl::StatusOr<std::vector<ValueId>> EliminateDeadCode(Graph& graph) {
  std::vector<bool> needed_value(static_cast<size_t>(graph.num_values()), false);
  for (ValueId id : graph.losses()) needed_value[static_cast<size_t>(id)] = true;
  for (const auto& [name, id] : graph.fetches()) needed_value[static_cast<size_t>(id)] = true;
  for (const auto& [var, new_value] : graph.variable_updates()) {
    needed_value[static_cast<size_t>(var)] = true;
    needed_value[static_cast<size_t>(new_value)] = true;
  }
  // Node order is topological, so one reverse sweep propagates liveness.
  std::vector<bool> keep(static_cast<size_t>(graph.num_nodes()), false);
  for (NodeId id = graph.num_nodes() - 1; id >= 0; --id) {
    const Node& n = graph.node(id);
    bool live = n.kind == NodeKind::kInput;
    for (ValueId out : n.outputs) live = live || needed_value[static_cast<size_t>(out)];
    if (!live) continue;
    keep[static_cast<size_t>(id)] = true;
    for (ValueId in : n.inputs) needed_value[static_cast<size_t>(in)] = true;
  }
  return graph.KeepNodes(keep);
}

}  // namespace tessera::graph
