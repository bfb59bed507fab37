// The variables step: a Parameter per rank for each variable something
// reads, and the variable's optimizer update running inside those tasks.

#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler::lowering {

void Lowering::AddKept(uint64_t task, const std::string& name, const TensorSlice& slice) {
  std::string key = StrCat(name, "@");
  for (int64_t o : slice.offset) key += StrCat(o, ",");
  key += slice.local.ToString();
  builder_.AddKept(task, name, written_slices_.insert(std::move(key)).second);
}

absl::Status Lowering::LowerVariable(const Node& node) {
  const ValueId var = node.outputs[0];
  if (facts_.state_of.contains(var) || !facts_.read.contains(var)) return absl::OkStatus();
  const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(node.id)];
  const int64_t stage = layout.stage;
  const std::string& name = graph_.value(var).name;
  for (int64_t i = 0; i < placement(stage).size(); ++i) {
    const std::string suffix = Suffix(stage, i);
    ASSIGN_OR_RETURN(const uint64_t task, NewTask(proto::ACTOR_KIND_PARAMETER, StrCat("param:", name, suffix),
                                                  kComputeStream, Device(stage, i)));
    builder_.task(task).set_callback(StrCat("init:", name, suffix));
    ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(var, layout.outputs[0], i));
    ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(var, layout.outputs[0], i));
    const graph::InitRule& init = graph_.variable_info(var).init;
    builder_.AddInitRule(task, init.op, init.attrs, {slice});
    AddKept(task, name, slice);
    param_tasks_[var].push_back(task);
    ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, 1, {meta}));
    Produced(node, stage, i, desc);
  }
  return absl::OkStatus();
}

// The optimizer update of `owner` runs inside its Parameter task on every rank,
// in place on the variable's shard and the state shards.
absl::Status Lowering::LowerUpdate(const Node& update, ValueId owner) {
  const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(update.id)];
  const NodeLayout& var_layout = sbp_.nodes[static_cast<size_t>(graph_.value(owner).producer)];
  if (!param_tasks_.contains(owner)) return absl::OkStatus();  // never read
  // State tensors, in output order.
  std::vector<ValueId> states(update.outputs.size() > 0 ? update.outputs.size() - 1 : 0, graph::kNoValue);
  if (auto it = facts_.states_of_owner.find(owner); it != facts_.states_of_owner.end()) {
    for (const auto& [state, index] : it->second) {
      if (index >= 0 && static_cast<size_t>(index) < states.size()) states[static_cast<size_t>(index)] = state;
    }
  }
  const std::vector<uint64_t>& tasks = param_tasks_.at(owner);
  for (size_t i = 0; i < tasks.size(); ++i) {
    const uint64_t task = tasks[i];
    for (ValueId state : states) {
      if (state == graph::kNoValue) return absl::UnimplementedError(StrCat("scheduler: ", update.op, " has an output that updates nothing"));
      const NdSbp& state_sbp = sbp_.values[static_cast<size_t>(state)].nd_sbp;
      ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(state, state_sbp, static_cast<int64_t>(i)));
      ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(state, state_sbp, static_cast<int64_t>(i)));
      builder_.AddState(task, meta);
      const graph::InitRule& init = graph_.variable_info(state).init;
      builder_.AddInitRule(task, init.op, init.attrs, {slice});
      AddKept(task, graph_.value(state).name, slice);
    }
    builder_.SetOp(task, update.op, update.attrs);
    const int64_t own_desc = shards_.at({owner, layout.stage, NdSbpToString(var_layout.outputs[0])}).at(i).desc;
    for (size_t k = 0; k < update.inputs.size(); ++k) {
      const ValueId in = update.inputs[k];
      if (in == owner) {
        builder_.AddInput(task, own_desc, 0);
      } else if (facts_.state_of.contains(in)) {
        builder_.AddStateInput(task, facts_.state_of.at(in).second);
        ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(in, sbp_.values[static_cast<size_t>(in)].nd_sbp, static_cast<int64_t>(i)));
        RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_inputs(static_cast<int>(k)), in, slice, false));
        continue;
      } else {
        ASSIGN_OR_RETURN(Shard shard, Read(in, layout.stage, layout.inputs[k], static_cast<int64_t>(i), task));
        builder_.AddInput(task, shard.desc, shard.tensor);
      }
      const proto::TensorRef& added = builder_.task(task).inputs(static_cast<int>(k));
      if (added.location_case() == proto::TensorRef::kRegisterDescId) {
        ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(in, layout.inputs[k], static_cast<int64_t>(i)));
        RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_inputs(static_cast<int>(k)), in, slice, false));
      }
    }
    builder_.AddOutput(task, own_desc, 0);
    ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(owner, var_layout.outputs[0], static_cast<int64_t>(i)));
    RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_outputs(0), owner, slice, false));
    for (size_t k = 1; k < update.outputs.size(); ++k) {
      builder_.AddStateOutput(task, static_cast<int32_t>(k - 1));
      const ValueId state = states[k - 1];
      ASSIGN_OR_RETURN(TensorSlice state_slice, SliceOf(state, sbp_.values[static_cast<size_t>(state)].nd_sbp, static_cast<int64_t>(i)));
      RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_outputs(static_cast<int>(k)), state, state_slice, false));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::scheduler::lowering
