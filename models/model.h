#pragma once
// A trainable model as the trainer sees it: it builds its logical graph (one
// marked loss) for a batch size and fills the graph inputs it declares with
// its own (synthetic, seeded) data. Models are built from the config node
// `model` by `_target_` (e.g. "models.MLP") through a Registry<Model> that the
// caller owns and fills with RegisterBuiltinModels. Model methods are const
// and may be called from any thread.

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/registry.h"
#include "core/tensor.h"
#include "graph/graph.h"

namespace tessera::models {

class Model {
 public:
  virtual ~Model() = default;
  // The graph with its inputs, variables and one loss; metrics may be fetched.
  virtual absl::StatusOr<graph::Graph> BuildGraph(int64_t batch) const = 0;
  // Writes the data of graph input `input` for `iteration` into `out`
  // (preallocated with the input's meta). Deterministic in (seed, iteration).
  virtual absl::Status FillBatch(int64_t iteration, std::string_view input, const Tensor& out) const = 0;
};

// Registers every model of models/ ("models.MLP") into `registry`.
[[nodiscard]] absl::Status RegisterBuiltinModels(Registry<Model>& registry);

}  // namespace tessera::models
