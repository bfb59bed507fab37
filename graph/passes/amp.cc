// Automatic mixed precision: matmuls (and matmul_bias_gelu's x and weight)
// read their f32 inputs cast to bf16 or f16; everything else stays f32.

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
  // (matmul_bias_gelu's bias stays f32).
  const std::map<std::string, size_t> allow = {{"matmul", 2}, {"batch_matmul", 2}, {"matmul_bias_gelu", 2}};
  MixedPrecisionResult result;
  Graph out(&graph.registry());
  std::vector<ValueId>& remap = result.remap;
  remap.assign(static_cast<size_t>(graph.num_values()), kNoValue);
  for (const Node& n : graph.nodes()) {
    std::vector<ValueId> inputs;
    for (ValueId in : n.inputs) inputs.push_back(remap[static_cast<size_t>(in)]);
    bool all_f32 = !n.inputs.empty();
    for (ValueId in : n.inputs) all_f32 = all_f32 && graph.value(in).meta.dtype == DType::kF32;
    if (n.kind == NodeKind::kOp && allow.contains(n.op) && all_f32) {
      // A cast per reader: each cast's gradient then comes from one op,
      // and the gradients of a value read by several matmuls meet in f32.
      for (size_t i = 0; i < allow.at(n.op); ++i) {
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
