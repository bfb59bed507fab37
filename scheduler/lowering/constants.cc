// The constants step: an op without inputs (ones, fill...) is computed once
// by its initializer and held like a variable that is never updated.

#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler::lowering {

absl::Status Lowering::LowerConstant(const Node& node) {
  const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(node.id)];
  const int64_t stage = layout.stage;
  const Placement& where = placement(stage);
  for (int64_t i = 0; i < where.size(); ++i) {
    const proto::RankLocation& device = Device(stage, i);
    const std::string suffix = Suffix(stage, i);
    ASSIGN_OR_RETURN(const uint64_t task,
                     NewTask(proto::ACTOR_KIND_PARAMETER, StrCat("const:", node.op, ":", node.id, suffix),
                             kComputeStream, device));
    std::vector<TensorMeta> metas;
    std::vector<TensorSlice> slices;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(node.outputs[k], layout.outputs[k], i));
      ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(node.outputs[k], layout.outputs[k], i));
      metas.push_back(meta);
      slices.push_back(slice);
    }
    builder_.AddInitRule(task, node.op, node.attrs, slices);
    ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, 1, metas));
    if (!MicroRate(node) || rates_.num_micro_batches == 1) {
      Produced(node, stage, i, desc);
      continue;
    }
    // Read once per micro-batch, it is handed out through one Repeat per
    // output, so backward can hold it as long as its quota says.
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      ASSIGN_OR_RETURN(const uint64_t repeat,
                       NewTask(proto::ACTOR_KIND_REPEAT, StrCat("repeat:const:", node.id, ":", k, suffix),
                               kComputeStream, device));
      builder_.task(repeat).set_repeat_num(rates_.num_micro_batches);
      builder_.task(repeat).set_input_tensor(static_cast<int32_t>(k));
      SetRate(repeat, true);
      builder_.AddConsumer(desc, repeat);
      ASSIGN_OR_RETURN(const int64_t views,
                       NewDesc(repeat, Quota({node.outputs[k]}, stage, options_.default_quota), {metas[k]}));
      std::vector<Shard>& shards = shards_[{node.outputs[k], stage, NdSbpToString(layout.outputs[k])}];
      shards.resize(static_cast<size_t>(where.size()));
      shards[static_cast<size_t>(i)] = {views, 0};
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::scheduler::lowering
