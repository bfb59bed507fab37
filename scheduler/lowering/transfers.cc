// The transfers step (pipeline): a value read on another stage than its
// producer's is converted to the reader's layout on the producer's stage,
// then sent by one Send / Recv pair per parallel id.

#include <algorithm>

#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler::lowering {

absl::Status Lowering::LowerTransfer(ValueId v, int64_t stage, const NdSbp& sbp) {
  const ValueLayout& from = sbp_.values[static_cast<size_t>(v)];
  const bool micro = MicroRate(v);
  const graph::Value& value = graph_.value(v);
  const std::string what = value.name.empty() ? graph::ValueRef(v) : value.name;
  // Across stages: convert on the producer's stage first, then one
  // point-to-point transfer per parallel id (stages share the mesh shape).
  // Every transfer from one rank to another shares that pair's
  // communicator; the coordinator issues them in their launch order on
  // both sides (actors/launch_order.h).
  RETURN_IF_ERROR(Ensure(v, from.stage, sbp));
  const std::vector<Shard>& source = shards_.at({v, from.stage, NdSbpToString(sbp)});
  // On GPUs each device launches its collectives and transfers in one lane
  // (actors/launch_order.h), a transfer at its reader's step: the sender
  // keeps each micro-batch's register until then, so it gets the registers
  // that takes (comm::SenderRegisters: more than one for a value that
  // skips stages per micro-batch, or where a collective writes them).
  if (micro && rates_.num_micro_batches > 1 && options_.parallel.device_type == DeviceType::kCuda) {
    if (!clock_) clock_.emplace(mesh_.num_stages(), rates_.num_micro_batches);
    for (const Shard& shard : source) {
      proto::RegisterDesc& desc = builder_.mutable_plan().mutable_register_descs()->at(static_cast<int>(shard.desc));
      if (desc.id() != shard.desc) {
        return absl::InternalError(StrCat("register desc ", shard.desc, " is not at its index"));
      }
      const bool collective = builder_.task(desc.producer()).kind() == proto::ACTOR_KIND_COLLECTIVE;
      const int32_t needed =
          comm::SenderRegisters(*clock_, from.stage, stage, facts_.backward[static_cast<size_t>(v)], collective);
      if (desc.register_num() < needed) desc.set_register_num(needed);
    }
  }
  std::vector<Shard>& target = shards_[{v, stage, NdSbpToString(sbp)}];
  const int64_t order = NewConversion(v);
  for (int64_t i = 0; i < placement(stage).size(); ++i) {
    const std::string group = StrCat("p2p/", Rank(from.stage, i), "->", Rank(stage, i));
    ASSIGN_OR_RETURN(const uint64_t send,
                     NewTask(proto::ACTOR_KIND_SEND, StrCat("send:", what, ":", order, Suffix(from.stage, i)),
                             kTransferStream, Device(from.stage, i)));
    ASSIGN_OR_RETURN(const uint64_t recv,
                     NewTask(proto::ACTOR_KIND_RECV, StrCat("recv:", what, ":", order, Suffix(stage, i)),
                             kTransferStream, Device(stage, i)));
    for (uint64_t task : {send, recv}) {
      proto::TransferDesc* t = builder_.task(task).mutable_transfer();
      t->set_group(group);
      t->set_order(order);
      t->set_peer(static_cast<uint32_t>(task == send ? Rank(stage, i) : Rank(from.stage, i)));
      proto::LaunchOrder* launch = t->mutable_launch();
      launch->set_epoch(facts_.epoch[static_cast<size_t>(v)]);
      launch->set_backward(facts_.backward[static_cast<size_t>(v)]);
      launch->set_stage(static_cast<int32_t>(task == send ? from.stage : stage));
      t->set_peer_stage(static_cast<int32_t>(task == send ? stage : from.stage));
      launch->set_num_stages(static_cast<int32_t>(mesh_.num_stages()));
      SetRate(task, micro);
    }
    builder_.task(send).mutable_transfer()->set_input_tensor(source[static_cast<size_t>(i)].tensor);
    builder_.AddConsumer(source[static_cast<size_t>(i)].desc, send);
    ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(v, sbp, i));
    ASSIGN_OR_RETURN(const int64_t desc,
                     NewDesc(recv, Quota({v}, stage, std::max(2, options_.default_quota)), {meta}));
    target.push_back({desc, 0});
  }
  return absl::OkStatus();
}

}  // namespace tessera::scheduler::lowering
