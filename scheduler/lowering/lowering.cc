#include "scheduler/lowering/lowering.h"

#include <algorithm>
#include <utility>

#include "core/checked.h"

namespace tessera::scheduler::lowering {

using graph::NodeKind;

absl::StatusOr<LoweredPlan> Lowering::Run() {
  for (const Node& node : graph_.nodes()) RETURN_IF_ERROR(LowerNode(node));
  RETURN_IF_ERROR(LowerSink());
  GateMicroBatches();
  RETURN_IF_ERROR(CheckDeviceType());
  if (options_.async_compute || options_.parallel.device_type == DeviceType::kCuda) {
    std::vector<uint64_t> kernels;  // the tasks that run kernels
    for (const proto::Task& task : builder_.plan().tasks()) {
      const bool with_op = (task.kind() == proto::ACTOR_KIND_COMPUTE || task.kind() == proto::ACTOR_KIND_PARAMETER) &&
                           !task.op().empty();
      if (with_op || task.kind() == proto::ACTOR_KIND_ACC) kernels.push_back(task.actor_id());
    }
    for (uint64_t id : kernels) builder_.task(id).set_async_acts(true);
  }
  // Name the tensors for `tessera plan` by the values they hold (before the
  // fold renumbers the descs).
  for (const auto& [key, shards] : shards_) {
    const graph::Value& value = graph_.value(key.value);
    const std::string name = value.name.empty() ? graph::ValueRef(value.id) : value.name;
    for (const Shard& shard : shards) {
      auto* tensor =
          builder_.mutable_plan().mutable_register_descs(static_cast<int>(shard.desc))->mutable_tensors(shard.tensor);
      if (tensor->name().empty() || tensor->name().starts_with("t")) tensor->set_name(StrCat(name, " ", key.sbp));
    }
  }
  if (options_.fold_reshapes && builder_.status().ok()) {
    RETURN_IF_ERROR(FoldReshapes(builder_.mutable_plan()));
    builder_.Reindex();
  }
  out_.plan = builder_.Build();
  for (const proto::RankLocation& location : locations_) *out_.plan.add_ranks() = location;
  RETURN_IF_ERROR(builder_.status());
  OrderConversions(out_.plan);
  out_.plan.set_mesh(mesh_.ToString());
  out_.plan.set_start_iteration(options_.start_iteration);
  out_.sbp_text = sbp_.ToText(graph_);
  return std::move(out_);
}

absl::Status Lowering::CheckDeviceType() const {
  if (options_.parallel.device_type == DeviceType::kCpu) return absl::OkStatus();
  const std::string type(DeviceTypeName(options_.parallel.device_type));
  for (const proto::Task& task : builder_.plan().tasks()) {
    if (task.op().empty()) continue;
    const ops::OpSchema* schema = graph_.registry().Find(task.op());
    if (schema != nullptr && schema->FindKernel(options_.parallel.device_type) == nullptr) {
      return absl::UnimplementedError(
          StrCat("op '", task.op(), "' (task '", task.name(), "') has no ", type, " kernel"));
    }
  }
  return absl::OkStatus();
}

void Lowering::GateMicroBatches() {
  const int64_t m = rates_.num_micro_batches;
  for (const auto& [device, accs] : window_accs_) {
    const int64_t window = mesh_.num_stages() - device.first;
    auto sources = window_sources_.find(device);
    if (window >= m || sources == window_sources_.end()) continue;
    for (uint64_t acc : accs) builder_.AddWindowDesc(acc, sources->second, static_cast<int32_t>(window));
  }
}

absl::Status Lowering::LowerNode(const Node& node) {
  switch (node.kind) {
    case NodeKind::kInput: return LowerInput(node);
    case NodeKind::kVariable: return LowerVariable(node);
    case NodeKind::kOp:
      if (const auto owner = facts_.update_owner.find(node.id); owner != facts_.update_owner.end()) {
        return LowerUpdate(node, owner->second);
      }
      return node.inputs.empty() ? LowerConstant(node) : LowerCompute(node);
    case NodeKind::kRepeat:
    case NodeKind::kAcc: return LowerAccumulation(node);
  }
  return absl::InternalError(StrCat("scheduler: node ", node.id, " has an unknown kind"));
}

absl::Status Lowering::Ensure(ValueId v, int64_t stage, const NdSbp& sbp) {
  if (shards_.contains({v, stage, NdSbpToString(sbp)})) return absl::OkStatus();
  if (sbp_.values[static_cast<size_t>(v)].stage != stage) return LowerTransfer(v, stage, sbp);
  return LowerBoxing(v, stage, sbp);
}

absl::StatusOr<Shard> Lowering::Read(ValueId v, int64_t stage, const NdSbp& sbp, int64_t i, uint64_t consumer) {
  RETURN_IF_ERROR(Ensure(v, stage, sbp));
  const Shard shard = shards_.at({v, stage, NdSbpToString(sbp)}).at(static_cast<size_t>(i));
  builder_.AddConsumer(shard.desc, consumer);
  return shard;
}

absl::Status Lowering::SetRef(proto::TensorRef* ref, ValueId v, const TensorSlice& slice, bool draws) {
  const Shape& logical = graph_.value(v).meta.shape;
  int axis = -1;  // the axis the micro-batches are laid along, if they move the draws
  if (draws && MicroRate(v) && rates_.num_micro_batches > 1 && logical.rank() > 0) {
    const std::optional<Sbp>& layout = facts_.micro_layout[static_cast<size_t>(v)];
    if (!layout) {
      const Node& producer = graph_.producer(v);
      return absl::UnimplementedError(
          StrCat("scheduler: '", graph_.value(v).name.empty() ? graph::ValueRef(v) : graph_.value(v).name, "' (",
                 graph_.value(v).meta.ToString(), ", made by ", producer.op.empty() ? "a node" : producer.op,
                 producer.scope.empty() ? "" : StrCat(" in '", producer.scope, "'"),
                 ") feeds a random op under gradient accumulation, but no op's SBP "
                 "signature says along which axis its micro-batches lie, so its random numbers would depend on "
                 "num_accumulation_steps"));
    }
    // Split: the micro-batches lie along that axis. Broadcast or partial:
    // every micro-batch draws at the same indices, as one iteration would.
    if (layout->is_split()) axis = layout->axis();
  }
  if (slice.local == logical && axis < 0) return absl::OkStatus();
  for (int a = 0; a < logical.rank(); ++a) {
    int64_t extent = logical[a];
    if (a == axis) {
      ASSIGN_OR_RETURN(extent, CheckedMul(logical[a], rates_.num_micro_batches,
                                          StrCat("axis ", a, " of '", graph_.value(v).name, "' x micro-batches")));
    }
    ref->mutable_slice()->add_logical_shape(extent);
    ref->mutable_slice()->add_offset(slice.offset[static_cast<size_t>(a)]);
  }
  if (axis >= 0) {
    ref->set_micro_batch_stride(logical[axis]);
    ref->set_micro_batch_axis(axis);
  }
  return absl::OkStatus();
}

void Lowering::Produced(const Node& node, int64_t stage, int64_t i, int64_t desc) {
  const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(node.id)];
  for (size_t k = 0; k < node.outputs.size(); ++k) {
    shards_[{node.outputs[k], stage, NdSbpToString(layout.outputs[k])}].resize(static_cast<size_t>(placement(stage).size()));
    shards_[{node.outputs[k], stage, NdSbpToString(layout.outputs[k])}][static_cast<size_t>(i)] = {desc, static_cast<int32_t>(k)};
  }
}

int32_t Lowering::Quota(const std::vector<ValueId>& values, int64_t stage, int32_t base) const {
  for (ValueId v : values) {
    if (facts_.kept_for_backward.contains(v) && MicroRate(v)) {
      return std::max(base, static_cast<int32_t>(mesh_.num_stages() - stage));
    }
  }
  return base;
}

absl::StatusOr<uint64_t> Lowering::NewTask(proto::ActorKind kind, std::string name, uint32_t stream,
                                           const proto::RankLocation& device) {
  const uint64_t task = builder_.AddTask(kind, std::move(name), stream, device.device_index(), device.node());
  RETURN_IF_ERROR(builder_.status());
  return task;
}

absl::StatusOr<int64_t> Lowering::NewDesc(uint64_t task, int32_t quota, const std::vector<TensorMeta>& tensors) {
  const int64_t desc = builder_.AddRegisterDesc(task, {}, quota, tensors);
  RETURN_IF_ERROR(builder_.status());
  return desc;
}

// The global order of conversions: by the position of the node producing
// the converted value (a topological order of when the data can exist), then
// by creation. A conversion that depends on another's output reads a value
// produced after that one's consumer, hence after its producer, so the order
// is topological; and a gradient's all-reduce goes as soon as the gradient
// exists rather than after every later layer's backward collectives.
void Lowering::OrderConversions(proto::Plan& plan) const {
  std::vector<int64_t> by_producer(conversion_producer_.size());
  for (size_t i = 0; i < by_producer.size(); ++i) by_producer[i] = static_cast<int64_t>(i);
  std::stable_sort(by_producer.begin(), by_producer.end(), [&](int64_t a, int64_t b) {
    return conversion_producer_[static_cast<size_t>(a)] < conversion_producer_[static_cast<size_t>(b)];
  });
  std::vector<int64_t> order(by_producer.size());
  for (size_t rank = 0; rank < by_producer.size(); ++rank) order[static_cast<size_t>(by_producer[rank])] = static_cast<int64_t>(rank);
  for (proto::Task& task : *plan.mutable_tasks()) {
    if (task.has_boxing()) task.mutable_boxing()->set_order(order[static_cast<size_t>(task.boxing().order())]);
    if (task.has_transfer()) task.mutable_transfer()->set_order(order[static_cast<size_t>(task.transfer().order())]);
  }
}

}  // namespace tessera::scheduler::lowering
