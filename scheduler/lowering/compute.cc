// The compute step: a Compute per rank for each op that reads something and
// updates no variable (with its kernel's workspace, Task.scratch_bytes, when
// the op declares one).

#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler::lowering {

absl::Status Lowering::LowerCompute(const Node& node) {
  const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(node.id)];
  const int64_t stage = layout.stage;
  const ops::OpSchema* schema = graph_.schema(node);
  // (A rate of 0 draws nothing: such a node, bias_dropout_add fused from a
  // residual add, was refused under accumulation as a random op.)
  const bool draws = schema != nullptr && schema->Draws(node.attrs);
  for (int64_t i = 0; i < placement(stage).size(); ++i) {
    const std::string name = StrCat(node.scope.empty() ? std::string() : StrCat(node.scope, "/"), node.op, ":", node.id,
                                    Suffix(stage, i));
    ASSIGN_OR_RETURN(const uint64_t task, NewTask(proto::ACTOR_KIND_COMPUTE, name, kComputeStream, Device(stage, i)));
    builder_.SetOp(task, node.op, node.attrs);
    SetRate(task, MicroRate(node));
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      ASSIGN_OR_RETURN(Shard shard, Read(node.inputs[k], stage, layout.inputs[k], i, task));
      builder_.AddInput(task, shard.desc, shard.tensor);
      ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(node.inputs[k], layout.inputs[k], i));
      RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_inputs(static_cast<int>(k)), node.inputs[k], slice, draws));
    }
    std::vector<TensorMeta> metas;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(node.outputs[k], layout.outputs[k], i));
      metas.push_back(meta);
    }
    if (schema != nullptr) {  // the kernel's workspace, planned into the arena with the registers
      std::vector<TensorMeta> input_metas;
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(node.inputs[k], layout.inputs[k], i));
        input_metas.push_back(meta);
      }
      const int64_t workspace =
          schema->WorkspaceBytes(input_metas, metas, node.attrs, options_.parallel.device_type);
      if (workspace > 0) builder_.task(task).set_scratch_bytes(workspace);
    }
    ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, Quota(node.outputs, stage, options_.default_quota), metas));
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      builder_.AddOutput(task, desc, static_cast<int32_t>(k));
      ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(node.outputs[k], layout.outputs[k], i));
      RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_outputs(static_cast<int>(k)), node.outputs[k], slice, draws));
    }
    Produced(node, stage, i, desc);
  }
  return absl::OkStatus();
}

}  // namespace tessera::scheduler::lowering
