#pragma once
// A reference interpreter for graphs — a TEST ORACLE, never used by the
// engine (which compiles graphs into plans run by actors). It evaluates every
// node in order with ops::RunOp on the CPU, from input feeds and the current
// variable values, then applies the graph's variable updates.
//
// Gradient accumulation (repeat / acc nodes, m micro-batches): nodes that
// read a repeat output run m times, micro-batch k reading rows
// [k n, (k + 1) n) of each input feed they use (feeds hold the global batch,
// m n rows; n is the input's micro-batch extent); acc nodes sum the m values;
// everything else runs once. Per-micro-batch values returned by Run are
// those of the last micro-batch.
//
// Not thread-safe. Borrows the graph, which must outlive it.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "graph/graph.h"

namespace tessera::graph::testing {

class GraphInterpreter {
 public:
  explicit GraphInterpreter(const Graph& graph) : graph_(graph) {}

  // Runs every variable's init op (at step 0).
  absl::Status InitVariables();
  absl::Status SetVariable(std::string_view name, const Tensor& value);
  absl::StatusOr<Tensor> GetVariable(std::string_view name) const;
  const Tensor& variable(ValueId id) const { return variables_.at(id); }

  // Evaluates the graph: returns every value's tensor, indexed by ValueId.
  // `feeds` maps each graph input's name to its tensor (meta must match).
  // Afterwards each updated variable holds its new value.
  absl::StatusOr<std::vector<Tensor>> Run(const std::map<std::string, Tensor>& feeds, int64_t step = 0);

 private:
  const Graph& graph_;
  std::map<ValueId, Tensor> variables_;
};

}  // namespace tessera::graph::testing
