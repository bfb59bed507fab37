// Gradient buckets: small gradients reduced together, one collective per
// bucket, as soon as the bucket's last gradient exists.

#include <algorithm>

#include "core/status.h"
#include "core/text.h"
#include "graph/passes.h"

namespace tessera::graph {

absl::StatusOr<BucketResult> BucketGradients(Graph& graph, GradientMap& gradients, int64_t bucket_bytes,
                                             const NdSbp& reduced, const SameStageFn& same_stage) {
  BucketResult result;
  if (bucket_bytes <= 0) return result;
  // Gradients in the order they are computed (backward makes the last
  // layers' first), each bucket on one stage and at most bucket_bytes.
  std::vector<std::pair<ValueId, ValueId>> order;  // (gradient, variable)
  for (const auto& [var, grad] : gradients) {
    if (!graph.IsValidValue(var) || !graph.IsValidValue(grad)) {
      return absl::InvalidArgumentError(StrCat("gradient buckets: bad pair ", ValueRef(var), " -> ", ValueRef(grad)));
    }
    const TensorMeta& meta = graph.value(grad).meta;
    if (meta.dtype != DType::kF32 || meta.shape.NumElements() * 4 >= bucket_bytes) continue;
    order.emplace_back(grad, var);
  }
  std::sort(order.begin(), order.end(), [&graph](const auto& a, const auto& b) {
    return graph.value(a.first).producer < graph.value(b.first).producer;
  });
  const auto layer_of = [&graph](ValueId var) { return graph.producer(var).layer_idx; };
  std::vector<std::vector<std::pair<ValueId, ValueId>>> buckets;
  int64_t bytes = 0;
  for (const auto& entry : order) {
    const int64_t size = graph.value(entry.first).meta.shape.NumElements() * 4;
    const bool fits = !buckets.empty() && bytes + size <= bucket_bytes &&
                      (!same_stage || same_stage(layer_of(buckets.back().front().second), layer_of(entry.second)));
    if (!fits) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(entry);
    bytes += size;
  }
  for (const auto& bucket : buckets) {
    if (bucket.size() < 2) continue;
    const NodeOptions at{.layer_idx = layer_of(bucket.front().second),
                         .scope = StrCat("grad_bucket/", result.buckets),
                         .name = "",
                         .backward = true};
    std::vector<ValueId> flat;
    std::vector<int64_t> sizes;
    for (const auto& [grad, var] : bucket) {
      const int64_t n = graph.value(grad).meta.shape.NumElements();
      ASSIGN_OR_RETURN(std::vector<ValueId> reshaped,
                       graph.AddOp("reshape", {grad}, {{"shape", std::vector<int64_t>{n}}}, at));
      flat.push_back(reshaped.front());
      sizes.push_back(n);
    }
    ASSIGN_OR_RETURN(std::vector<ValueId> joined, graph.AddOp("concat", flat, {{"axis", int64_t{0}}}, at));
    // The one reduction: the bucket held in `reduced` (e.g. B over data
    // parallel), which its partial sum is converted to once.
    ASSIGN_OR_RETURN(std::vector<ValueId> held, graph.AddOp("depend", {joined.front(), joined.front()}, {}, at));
    RETURN_IF_ERROR(graph.SetHints(held.front(), std::nullopt, reduced));
    ASSIGN_OR_RETURN(std::vector<ValueId> pieces,
                     graph.AddOp("split", {held.front()}, {{"axis", int64_t{0}}, {"sizes", sizes}}, at));
    for (size_t k = 0; k < bucket.size(); ++k) {
      const auto& [grad, var] = bucket[k];
      ASSIGN_OR_RETURN(std::vector<ValueId> shaped,
                       graph.AddOp("reshape", {pieces[k]}, {{"shape", graph.value(grad).meta.shape.dims()}}, at));
      gradients[var] = shaped.front();
    }
    ++result.buckets;
    result.gradients += static_cast<int64_t>(bucket.size());
  }
  return result;
}

}  // namespace tessera::graph
