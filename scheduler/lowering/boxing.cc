// The boxing step (same stage): a value read in another nd-SBP than it was
// produced in is converted by one Collective task per rank of the stage
// (comm/collective/boxing.h), on the transfer stream.

#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler::lowering {

absl::Status Lowering::LowerBoxing(ValueId v, int64_t stage, const NdSbp& sbp) {
  const ValueLayout& from = sbp_.values[static_cast<size_t>(v)];
  const bool micro = MicroRate(v);
  const graph::Value& value = graph_.value(v);
  const std::string what = value.name.empty() ? graph::ValueRef(v) : value.name;
  const std::vector<Shard>& source = shards_.at({v, from.stage, NdSbpToString(from.nd_sbp)});
  const Placement& where = placement(stage);
  const int64_t order = NewConversion(v);
  std::vector<Shard> target;
  for (int64_t i = 0; i < where.size(); ++i) {
    ASSIGN_OR_RETURN(const uint64_t task,
                     NewTask(proto::ACTOR_KIND_COLLECTIVE, StrCat("boxing:", what, ":", order, Suffix(stage, i)),
                             kTransferStream, Device(stage, i)));
    proto::BoxingDesc* b = builder_.task(task).mutable_boxing();
    b->mutable_logical()->set_dtype(comm::ToProto(value.meta.dtype));
    for (int64_t d : value.meta.shape.dims()) b->mutable_logical()->add_shape(d);
    b->set_from(NdSbpToString(from.nd_sbp));
    b->set_to(NdSbpToString(sbp));
    for (int64_t h : where.hierarchy()) b->add_hierarchy(h);
    for (int64_t r : where.ranks()) b->add_ranks(static_cast<uint32_t>(r));
    b->set_rank_index(static_cast<int32_t>(i));
    b->set_group("coll");  // one communicator per member set, shared by every conversion over it
    b->set_order(order);
    proto::LaunchOrder* launch = b->mutable_launch();
    launch->set_epoch(facts_.epoch[static_cast<size_t>(v)]);
    launch->set_backward(facts_.backward[static_cast<size_t>(v)]);
    launch->set_stage(static_cast<int32_t>(stage));
    launch->set_num_stages(static_cast<int32_t>(mesh_.num_stages()));
    b->set_input_tensor(source[static_cast<size_t>(i)].tensor);
    b->set_description(DescribeBoxing(from, ValueLayout{stage, sbp}));
    SetRate(task, micro);
    builder_.AddConsumer(source[static_cast<size_t>(i)].desc, task);
    ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(v, sbp, i));
    ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, Quota({v}, stage, options_.default_quota), {meta}));
    target.push_back({desc, 0});
  }
  shards_[{v, stage, NdSbpToString(sbp)}] = std::move(target);
  return absl::OkStatus();
}

}  // namespace tessera::scheduler::lowering
