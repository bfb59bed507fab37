// The inputs step: a Source per rank for each graph input something reads.

#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler::lowering {

absl::Status Lowering::LowerInput(const Node& node) {
  if (!facts_.read.contains(node.outputs[0])) return absl::OkStatus();  // fed but unused: no task
  const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(node.id)];
  const int64_t stage = layout.stage;
  const std::string& name = graph_.value(node.outputs[0]).name;
  for (int64_t i = 0; i < placement(stage).size(); ++i) {
    const std::string callback = StrCat("input:", name, Suffix(stage, i));
    ASSIGN_OR_RETURN(const uint64_t task, NewTask(proto::ACTOR_KIND_SOURCE, callback, HostStream(), Device(stage, i)));
    builder_.task(task).set_callback(callback);
    SetRate(task, MicroRate(node));
    ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(node.outputs[0], layout.outputs[0], i));
    builder_.SetSource(task, name, graph_.value(node.outputs[0]).meta, slice);
    ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(node.outputs[0], layout.outputs[0], i));
    ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, Quota(node.outputs, stage, options_.source_quota), {meta}));
    if (MicroRate(node) && rates_.num_micro_batches > 1) window_sources_[{stage, i}].push_back(task);
    Produced(node, stage, i, desc);
  }
  return absl::OkStatus();
}

}  // namespace tessera::scheduler::lowering
