// The repeat / acc step (gradient accumulation): a Repeat hands an
// iteration's value out once per micro-batch; an Acc sums the micro-batches'
// values into one per iteration.

#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler::lowering {

absl::Status Lowering::LowerAccumulation(const Node& node) {
  const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(node.id)];
  const int64_t stage = layout.stage;
  const bool repeat = node.kind == graph::NodeKind::kRepeat;
  for (int64_t i = 0; i < placement(stage).size(); ++i) {
    ASSIGN_OR_RETURN(
        const uint64_t task,
        NewTask(repeat ? proto::ACTOR_KIND_REPEAT : proto::ACTOR_KIND_ACC,
                StrCat(node.op, ":", repeat ? graph_.value(node.inputs[0]).name : node.scope, ":", node.id,
                       Suffix(stage, i)),
                kComputeStream, Device(stage, i)));
    builder_.task(task).set_repeat_num(rates_.num_micro_batches);
    SetRate(task, MicroRate(node));
    ASSIGN_OR_RETURN(Shard shard, Read(node.inputs[0], stage, layout.inputs[0], i, task));
    builder_.task(task).set_input_tensor(shard.tensor);
    ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(node.outputs[0], layout.outputs[0], i));
    ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, Quota(node.outputs, stage, options_.default_quota), {meta}));
    if (!repeat) window_accs_[{stage, i}].push_back(task);
    Produced(node, stage, i, desc);
  }
  return absl::OkStatus();
}

}  // namespace tessera::scheduler::lowering
