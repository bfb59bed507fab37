// Automatic mixed precision: matmuls (and matmul_bias's and
// matmul_bias_gelu's x and weight, the fused attention's q, k, v) read their
// f32 inputs cast to bf16 or f16; everything else stays f32.

#include <map>

#include "core/status.h"
#include "core/text.h"
#include "graph/passes.h"

namespace tessera::graph {

absl::StatusOr<MixedPrecisionResult> AutoMixedPrecision(Graph& graph, DType low) {
  if (low != DType::kBF16 && low != DType::kF16) {
    return absl::InvalidArgumentError(
        StrCat("mixed precision: the low-precision type must be bf16 or f16, got ", DTypeName(low)));
  }
  for (const Node& n : graph.nodes()) {
    if (n.backward || n.kind == NodeKind::kRepeat || n.kind == NodeKind::kAcc) {
      return absl::FailedPreconditionError("mixed precision runs on the forward graph, before autodiff");
    }
  }
  // The ops that read low precision, and how many of their leading inputs
  // (the Linear ops' bias and the attention's mask stay as they are).
  const std::map<std::string, size_t> allow = {{"matmul", 2},          {"batch_matmul", 2},
                                               {"matmul_bias", 2},     {"matmul_bias_gelu", 2},
                                               {"flash_attention", 3}, {"flash_attention_masked", 3}};
  MixedPrecisionResult result;
  Graph out(&graph.registry());
  std::vector<ValueId>& remap = result.remap;
  remap.assign(static_cast<size_t>(graph.num_values()), kNoValue);
  for (const Node& n : graph.nodes()) {
    std::vector<ValueId> inputs;
    for (ValueId in : n.inputs) inputs.push_back(remap[static_cast<size_t>(in)]);
    const auto allowed = n.kind == NodeKind::kOp ? allow.find(n.op) : allow.end();
    bool to_low = allowed != allow.end() && n.inputs.size() >= allowed->second;
    for (size_t i = 0; to_low && i < allowed->second; ++i) {
      to_low = graph.value(n.inputs[i]).meta.dtype == DType::kF32;
    }
    if (to_low) {
      // A cast per reader: each cast's gradient then comes from one op,
      // and the gradients of a value read by several matmuls meet in f32.
      for (size_t i = 0; i < allowed->second; ++i) {
        ValueId& in = inputs[i];
        ASSIGN_OR_RETURN(
            std::vector<ValueId> cast,
            out.AddOp(
                "cast", {in}, {{"dtype", low}},
                {.layer_idx = n.layer_idx, .scope = n.scope, .name = "", .checkpoint_segment = n.checkpoint_segment}));
        in = cast.front();
      }
      ++result.ops;
    }
    RETURN_IF_ERROR(ReplayNode(graph, n, inputs, out, remap));
  }
  RETURN_IF_ERROR(ReplayMarks(graph, remap, out));
  graph = std::move(out);
  return result;
}

}  // namespace tessera::graph
