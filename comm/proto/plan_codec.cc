#include "comm/proto/plan_codec.h"

#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_join.h"
#include "comm/proto/actor_id.h"
#include "comm/proto/memory_plan.h"
#include "core/checked.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/text.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace tessera::comm {
namespace {

template <typename Repeated>
std::vector<int64_t> ToVector(const Repeated& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

}  // namespace

proto::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32: return proto::DTYPE_F32;
    case DType::kF16: return proto::DTYPE_F16;
    case DType::kBF16: return proto::DTYPE_BF16;
    case DType::kI32: return proto::DTYPE_I32;
    case DType::kI64: return proto::DTYPE_I64;
    case DType::kBool: return proto::DTYPE_BOOL;
    case DType::kF64: return proto::DTYPE_F64;
  }
  TESSERA_CHECK(false, "unknown dtype ", static_cast<int>(dtype));
  return proto::DTYPE_F32;
}

absl::StatusOr<DType> FromProto(proto::DType dtype) {
  switch (dtype) {
    case proto::DTYPE_F32: return DType::kF32;
    case proto::DTYPE_F16: return DType::kF16;
    case proto::DTYPE_BF16: return DType::kBF16;
    case proto::DTYPE_I32: return DType::kI32;
    case proto::DTYPE_I64: return DType::kI64;
    case proto::DTYPE_BOOL: return DType::kBool;
    case proto::DTYPE_F64: return DType::kF64;
    default: break;
  }
  return absl::InvalidArgumentError(StrCat("unknown dtype ", static_cast<int>(dtype), " in plan"));
}

proto::AttrValue ToProto(const ops::AttrValue& value) {
  proto::AttrValue out;
  std::visit(
      [&out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          out.set_b(v);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          out.set_i(v);
        } else if constexpr (std::is_same_v<T, double>) {
          out.set_f(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          out.set_s(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          out.mutable_ints()->mutable_values()->Add(v.begin(), v.end());
        } else {
          out.set_dtype(ToProto(v));
        }
      },
      value);
  return out;
}

absl::StatusOr<ops::AttrValue> FromProto(const proto::AttrValue& value) {
  switch (value.value_case()) {
    case proto::AttrValue::kB: return ops::AttrValue(value.b());
    case proto::AttrValue::kI: return ops::AttrValue(int64_t{value.i()});
    case proto::AttrValue::kF: return ops::AttrValue(value.f());
    case proto::AttrValue::kS: return ops::AttrValue(value.s());
    case proto::AttrValue::kInts: return ops::AttrValue(ToVector(value.ints().values()));
    case proto::AttrValue::kDtype: {
      ASSIGN_OR_RETURN(DType dtype, FromProto(value.dtype()));
      return ops::AttrValue(dtype);
    }
    case proto::AttrValue::VALUE_NOT_SET: break;
  }
  return absl::InvalidArgumentError("attribute value not set in plan");
}

absl::StatusOr<ops::AttrMap> AttrMapFromProto(const google::protobuf::Map<std::string, proto::AttrValue>& attrs) {
  ops::AttrMap out;
  for (const auto& [name, value] : attrs) {
    auto converted = FromProto(value);
    if (!converted.ok()) {
      return absl::InvalidArgumentError(StrCat("attribute '", name, "': ", converted.status().message()));
    }
    out.Set(name, *std::move(converted));
  }
  return out;
}

absl::StatusOr<TensorMeta> TensorMetaFromProto(const proto::TensorDesc& desc) {
  ASSIGN_OR_RETURN(DType dtype, FromProto(desc.dtype()));
  if (desc.shape_size() > kMaxTensorRank) {
    return absl::InvalidArgumentError(
        StrCat("tensor '", desc.name(), "' has ", desc.shape_size(), " dimensions (at most ", kMaxTensorRank, ")"));
  }
  TensorMeta meta{dtype, Shape(ToVector(desc.shape()))};
  if (auto bytes = CheckedByteSize(meta); !bytes.ok()) {
    return absl::InvalidArgumentError(StrCat("tensor '", desc.name(), "': ", bytes.status().message()));
  }
  return meta;
}

proto::TensorSlice ToProto(const TensorSlice& slice) {
  proto::TensorSlice out;
  if (slice.IsWhole()) return out;
  for (int a = 0; a < slice.logical.rank(); ++a) {
    out.add_logical_shape(slice.logical[a]);
    out.add_offset(slice.offset[static_cast<size_t>(a)]);
  }
  return out;
}

proto::TensorDesc ToProto(const TensorMeta& meta, std::string name) {
  proto::TensorDesc out;
  out.set_name(std::move(name));
  out.set_dtype(ToProto(meta.dtype));
  for (int64_t d : meta.shape.dims()) out.add_shape(d);
  return out;
}

absl::StatusOr<TensorSlice> TensorSliceFromProto(const proto::TensorSlice& slice, const Shape& local) {
  if (slice.logical_shape().empty() && slice.offset().empty()) return TensorSlice::Whole(local);
  if (slice.logical_shape_size() != local.rank() || slice.offset_size() != local.rank()) {
    return absl::InvalidArgumentError(StrCat("tensor slice rank mismatch: logical of ", slice.logical_shape_size(),
                                             " axes, offset of ", slice.offset_size(), " axes, local ",
                                             local.ToString()));
  }
  TensorSlice out;
  out.logical = Shape(ToVector(slice.logical_shape()));
  out.offset = ToVector(slice.offset());
  out.local = local;
  if (auto elements = CheckedNumElements(out.logical); !elements.ok()) {
    return absl::InvalidArgumentError(StrCat("tensor slice: logical ", elements.status().message()));
  }
  for (int a = 0; a < local.rank(); ++a) {
    // local[a] <= logical[a] first, so the subtraction cannot overflow.
    if (out.offset[static_cast<size_t>(a)] < 0 || local[a] > out.logical[a] ||
        out.offset[static_cast<size_t>(a)] > out.logical[a] - local[a]) {
      return absl::InvalidArgumentError(StrCat("tensor slice out of range on axis ", a, ": offset ",
                                               out.offset[static_cast<size_t>(a)], " + local ", local[a],
                                               " > logical ", out.logical[a]));
    }
  }
  return out;
}

absl::Status CheckPlanSize(const proto::Plan& plan) {
  const size_t bytes = plan.ByteSizeLong();
  if (bytes > static_cast<size_t>(kMaxPlanBytes)) {
    return absl::ResourceExhaustedError(StrCat("the plan takes ", bytes, " bytes, more than the ", kMaxPlanBytes,
                                               " a serialised plan may hold (", plan.tasks_size(), " tasks, ",
                                               plan.register_descs_size(), " register descs)"));
  }
  return absl::OkStatus();
}

std::string SerializePlan(const proto::Plan& plan) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);  // map entries in key order, not hash order
    TESSERA_CHECK(plan.SerializeToCodedStream(&coded), "plan serialisation failed (", plan.ByteSizeLong(),
                  " bytes; CheckPlanSize first)");
  }
  return bytes;
}

absl::StatusOr<proto::Plan> ParsePlan(std::string_view bytes) {
  if (bytes.size() > static_cast<size_t>(kMaxPlanBytes)) {
    return absl::InvalidArgumentError(
        StrCat("a plan of ", bytes.size(), " bytes is over the limit of ", kMaxPlanBytes));
  }
  proto::Plan plan;
  if (!plan.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(StrCat("cannot parse plan (", bytes.size(), " bytes)"));
  }
  return plan;
}

std::string SerializeNodePlan(const proto::NodePlan& node_plan) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    TESSERA_CHECK(node_plan.SerializeToCodedStream(&coded), "node plan serialisation failed (",
                  node_plan.ByteSizeLong(), " bytes; CheckPlanSize first)");
  }
  return bytes;
}

absl::StatusOr<proto::NodePlan> ParseNodePlan(std::string_view bytes) {
  if (bytes.size() > static_cast<size_t>(kMaxPlanBytes)) {
    return absl::InvalidArgumentError(StrCat("a node plan of ", bytes.size(), " bytes is over the limit of ", kMaxPlanBytes));
  }
  proto::NodePlan node_plan;
  if (!node_plan.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(StrCat("cannot parse node plan (", bytes.size(), " bytes)"));
  }
  return node_plan;
}

absl::StatusOr<std::vector<proto::NodePlan>> SplitPlan(const proto::Plan& plan) {
  uint32_t nodes = 1;
  for (const auto& rank : plan.ranks()) nodes = std::max(nodes, rank.node() + 1);
  if (plan.ranks_size() > 0 && nodes > static_cast<uint32_t>(plan.ranks_size())) {
    return absl::InvalidArgumentError(StrCat("plan ranks name node ", nodes - 1, " but list only ", plan.ranks_size(), " ranks"));
  }
  std::vector<proto::NodePlan> parts(nodes);
  for (uint32_t n = 0; n < nodes; ++n) {
    parts[n].set_node(n);
    proto::Plan& part = *parts[n].mutable_plan();
    part.set_iterations(plan.iterations());
    part.set_start_iteration(plan.start_iteration());
    part.set_mesh(plan.mesh());
    *part.mutable_ranks() = plan.ranks();
  }
  const auto node_of = [&](uint64_t actor_id) -> absl::StatusOr<uint32_t> {
    const uint32_t node = DecodeActorId(actor_id).node;
    if (node >= nodes) return absl::InvalidArgumentError(StrCat("task ", ActorIdToString(actor_id), " is on a node with no rank"));
    return node;
  };
  for (const auto& task : plan.tasks()) {
    ASSIGN_OR_RETURN(const uint32_t node, node_of(task.actor_id()));
    *parts[node].mutable_plan()->add_tasks() = task;
  }
  for (const auto& desc : plan.register_descs()) {
    ASSIGN_OR_RETURN(const uint32_t node, node_of(desc.producer()));
    for (uint64_t consumer : desc.consumers()) {
      if (DecodeActorId(consumer).node != node) {
        return absl::InvalidArgumentError(StrCat("register desc ", desc.id(), " of ", ActorIdToString(desc.producer()),
                                                 " is read on another node by ", ActorIdToString(consumer)));
      }
    }
    *parts[node].mutable_plan()->add_register_descs() = desc;
  }
  for (const auto& memory : plan.memory_estimate()) {
    if (memory.node() < nodes) *parts[memory.node()].mutable_plan()->add_memory_estimate() = memory;
  }
  for (const auto& arena : plan.arenas()) {
    if (arena.node() < nodes) *parts[arena.node()].mutable_plan()->add_arenas() = arena;
  }
  // Peers and spanning groups, from the ranks each collective and transfer names.
  // (A rank the plan does not list is an error where it lists ranks: it
  // was taken for node 0's, and the node left without the peer it needs.)
  const auto node_of_rank = [&](uint32_t rank, uint64_t actor_id) -> absl::StatusOr<uint32_t> {
    if (plan.ranks_size() == 0) return 0u;
    if (rank >= static_cast<uint32_t>(plan.ranks_size())) {
      return absl::InvalidArgumentError(StrCat("task ", ActorIdToString(actor_id), " names rank ", rank,
                                               ", but the plan lists only ", plan.ranks_size(), " ranks"));
    }
    return plan.ranks(static_cast<int>(rank)).node();
  };
  std::vector<std::set<uint32_t>> peers(nodes);
  std::vector<std::set<std::string>> groups(nodes);
  for (const auto& task : plan.tasks()) {
    const uint32_t node = DecodeActorId(task.actor_id()).node;
    std::vector<uint32_t> ranks;
    std::string group;
    if (task.kind() == proto::ACTOR_KIND_COLLECTIVE) {
      ranks.assign(task.boxing().ranks().begin(), task.boxing().ranks().end());
      group = StrCat(task.boxing().group(), "/", absl::StrJoin(ranks, ","));
    } else if (task.has_transfer()) {
      ranks.push_back(task.transfer().peer());
      group = task.transfer().group();
    }
    bool spans = false;
    for (uint32_t rank : ranks) {
      ASSIGN_OR_RETURN(const uint32_t other, node_of_rank(rank, task.actor_id()));
      if (other != node && other < nodes) {
        peers[node].insert(other);
        spans = true;
      }
    }
    if (spans) groups[node].insert(group);
  }
  for (uint32_t n = 0; n < nodes; ++n) {
    for (uint32_t peer : peers[n]) parts[n].add_peers(peer);
    for (const std::string& group : groups[n]) parts[n].add_groups(group);
  }
  return parts;
}

absl::StatusOr<std::vector<proto::DeviceMemory>> EstimateMemory(const proto::Plan& plan) {
  // By node, then device type and index as numbers (cpu:2 before cpu:10).
  std::map<std::tuple<uint32_t, int, int>, proto::DeviceMemory> devices;
  const auto entry = [&devices](uint64_t actor_id) -> proto::DeviceMemory& {
    const ActorId id = DecodeActorId(actor_id);
    const Device device = id.device();
    proto::DeviceMemory& m = devices[{id.node, static_cast<int>(device.type), device.index}];
    m.set_node(id.node);
    m.set_device(id.device().ToString());
    return m;
  };
  const auto add = [](int64_t& total, int64_t more, uint64_t actor_id) -> absl::Status {
    ASSIGN_OR_RETURN(total, CheckedAdd(total, more, StrCat("memory estimate of ", ActorIdToString(actor_id))));
    return absl::OkStatus();
  };
  std::unordered_map<uint64_t, const proto::Task*> tasks;
  for (const auto& task : plan.tasks()) tasks[task.actor_id()] = &task;
  const auto kind_of = [&tasks](uint64_t actor_id) {
    auto it = tasks.find(actor_id);
    return it == tasks.end() ? proto::ACTOR_KIND_UNSPECIFIED : it->second->kind();
  };
  for (const auto& desc : plan.register_descs()) {
    ASSIGN_OR_RETURN(const int64_t desc_bytes, CheckedMul(desc.bytes_per_register(), desc.register_num(),
                                                          StrCat("bytes of register desc ", desc.id())));
    proto::DeviceMemory& m = entry(desc.producer());
    int64_t field = 0;
    const proto::ActorKind kind = kind_of(desc.producer());
    if (kind == proto::ACTOR_KIND_PARAMETER) {
      field = m.parameters();
      RETURN_IF_ERROR(add(field, desc_bytes, desc.producer()));
      m.set_parameters(field);
      continue;
    }
    if (!ArenaEligible(desc, kind)) continue;
    bool gradient = false;
    for (uint64_t consumer : desc.consumers()) gradient |= kind_of(consumer) == proto::ACTOR_KIND_PARAMETER;
    if (gradient) {
      field = m.gradients();
      RETURN_IF_ERROR(add(field, desc_bytes, desc.producer()));
      m.set_gradients(field);
    } else {
      field = m.activations();
      RETURN_IF_ERROR(add(field, desc_bytes, desc.producer()));
      m.set_activations(field);
    }
    if (!desc.has_arena_offset()) {
      field = m.unplanned();
      RETURN_IF_ERROR(add(field, desc_bytes, desc.producer()));
      m.set_unplanned(field);
    }
  }
  // Collectives' scratch and kernels' workspace; each split input's host
  // batches (train/feeds.h): its logical bytes per register its sources may
  // hold, on the device of its first source; and each input fed in
  // micro-batches, its whole batch.
  std::map<std::pair<uint32_t, std::string>, std::pair<uint64_t, int64_t>> feeds;  // (node, input) -> (task, bytes)
  auto global_batches = feeds;  // inputs fed in micro-batches: the whole batch
  std::unordered_map<int64_t, const proto::RegisterDesc*> desc_of;
  for (const auto& desc : plan.register_descs()) desc_of[desc.id()] = &desc;
  for (const auto& task : plan.tasks()) {
    if ((task.kind() == proto::ACTOR_KIND_COLLECTIVE || task.kind() == proto::ACTOR_KIND_COMPUTE) &&
        task.scratch_bytes() > 0) {
      proto::DeviceMemory& m = entry(task.actor_id());
      int64_t field = m.boxing_scratch();
      RETURN_IF_ERROR(add(field, task.scratch_bytes(), task.actor_id()));
      m.set_boxing_scratch(field);
      if (!task.has_scratch_offset()) {
        field = m.unplanned();
        RETURN_IF_ERROR(add(field, task.scratch_bytes(), task.actor_id()));
        m.set_unplanned(field);
      }
    }
    if (task.kind() != proto::ACTOR_KIND_SOURCE || !task.has_source() || task.produced_register_desc_ids_size() != 1) continue;
    auto produced = desc_of.find(task.produced_register_desc_ids(0));
    if (produced == desc_of.end() || produced->second->tensors_size() != 1) continue;
    auto logical = TensorMetaFromProto(task.source().logical());
    auto local = TensorMetaFromProto(produced->second->tensors(0));
    if (!logical.ok() || !local.ok()) continue;
    const uint32_t node = DecodeActorId(task.actor_id()).node;
    if (const int64_t m = PiecesPerIteration(task); m > 1 && logical->shape.rank() > 0) {
      // Fed in m micro-batches: the feed fills the iteration's whole batch
      // once and hands out its rows (the trainer's JobFeed), m times the
      // micro-batch's bytes, once per node.
      ASSIGN_OR_RETURN(const int64_t micro_bytes, CheckedByteSize(*logical));
      ASSIGN_OR_RETURN(const int64_t batch_bytes,
                       CheckedMul(micro_bytes, m, StrCat("the global batch of input '", task.source().input(), "'")));
      auto [it, fresh] = global_batches.try_emplace({node, task.source().input()}, task.actor_id(), batch_bytes);
      if (!fresh) it->second.second = std::max(it->second.second, batch_bytes);
    }
    if (logical->shape == local->shape) continue;  // fed directly
    ASSIGN_OR_RETURN(const int64_t logical_bytes, CheckedByteSize(*logical));
    ASSIGN_OR_RETURN(const int64_t bytes, CheckedMul(logical_bytes, produced->second->register_num(),
                                                     StrCat("feed bytes of ", task.name())));
    auto [it, fresh] = feeds.try_emplace({node, task.source().input()}, task.actor_id(), bytes);
    if (!fresh) it->second.second = std::max(it->second.second, bytes);
  }
  for (const auto* held : {&feeds, &global_batches}) {
    for (const auto& [key, feed] : *held) {
      proto::DeviceMemory& m = entry(feed.first);
      int64_t field = m.feed_buffers();
      RETURN_IF_ERROR(add(field, feed.second, feed.first));
      m.set_feed_buffers(field);
    }
  }
  for (const auto& task : plan.tasks()) {
    for (const auto& state : task.state()) {
      ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(state));
      proto::DeviceMemory& m = entry(task.actor_id());
      int64_t field = m.optimizer_state();
      RETURN_IF_ERROR(add(field, *CheckedByteSize(meta), task.actor_id()));
      m.set_optimizer_state(field);
    }
  }
  // An arena names (node, device index); its device's type is its tasks'.
  std::map<std::pair<uint32_t, uint32_t>, DeviceType> type_of;
  for (const auto& task : plan.tasks()) {
    const ActorId id = DecodeActorId(task.actor_id());
    type_of.emplace(std::make_pair(id.node, id.device_index), id.device_type);
  }
  for (const auto& arena : plan.arenas()) {
    ActorId id;
    id.node = arena.node();
    id.device_index = arena.device_index();
    if (auto it = type_of.find({id.node, id.device_index}); it != type_of.end()) id.device_type = it->second;
    ASSIGN_OR_RETURN(const uint64_t encoded, EncodeActorId(id));
    proto::DeviceMemory& m = entry(encoded);
    int64_t field = m.arena();
    RETURN_IF_ERROR(add(field, arena.bytes(), encoded));
    m.set_arena(field);
  }
  std::vector<proto::DeviceMemory> out;
  for (auto& [key, m] : devices) {
    int64_t total = 0;
    for (int64_t part : {m.parameters(), m.optimizer_state(), m.arena(), m.unplanned(), m.feed_buffers()}) {
      ASSIGN_OR_RETURN(total, CheckedAdd(total, part, StrCat("memory estimate of node ", m.node(), " ", m.device())));
    }
    m.set_bytes(total);
    out.push_back(std::move(m));
  }
  return out;
}

void PlanBuilder::Fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
}

uint64_t PlanBuilder::AddTask(proto::ActorKind kind, std::string name, uint32_t stream, uint32_t device_index,
                              uint32_t node) {
  if (!status_.ok()) return kNoActorId;
  if (node > FieldMax(kNodeBits)) {
    Fail(absl::InvalidArgumentError(StrCat("task '", name, "' on node ", node, ": actor ids hold at most ",
                                           FieldMax(kNodeBits) + 1, " nodes (node is ", kNodeBits, " bits)")));
    return kNoActorId;
  }
  if (device_index > FieldMax(kDeviceIndexBits)) {
    Fail(absl::InvalidArgumentError(StrCat("task '", name, "' on ", DeviceTypeName(device_type_), ":",
                                           device_index, ": actor ids hold at most ",
                                           FieldMax(kDeviceIndexBits) + 1, " devices per node (device index is ",
                                           kDeviceIndexBits, " bits)")));
    return kNoActorId;
  }
  if (stream > FieldMax(kStreamBits)) {
    Fail(absl::InvalidArgumentError(StrCat("task '", name, "' on stream ", stream, ": actor ids hold at most ",
                                           FieldMax(kStreamBits) + 1, " streams per device (stream is ", kStreamBits,
                                           " bits)")));
    return kNoActorId;
  }
  ActorId id;
  id.node = node;
  id.device_type = device_type_;
  id.device_index = device_index;
  id.stream = stream;
  uint32_t& next = next_task_[StreamOf(*EncodeActorId(id))];
  if (next > FieldMax(kTaskBits)) {
    Fail(absl::ResourceExhaustedError(StrCat("task '", name, "': more than ", FieldMax(kTaskBits) + 1, " tasks on ",
                                             id.device().ToString(), " stream ", stream, " (task index is ", kTaskBits,
                                             " bits)")));
    return kNoActorId;
  }
  id.task = next++;
  const uint64_t encoded = *EncodeActorId(id);  // every field checked above
  index_[encoded] = plan_.tasks_size();
  proto::Task* task = plan_.add_tasks();
  task->set_actor_id(encoded);
  task->set_kind(kind);
  task->set_name(std::move(name));
  return encoded;
}

proto::Task& PlanBuilder::task(uint64_t actor_id) {
  auto it = index_.find(actor_id);
  TESSERA_CHECK(it != index_.end(), "no task ", ActorIdToString(actor_id));
  return *plan_.mutable_tasks(it->second);
}

int64_t PlanBuilder::AddRegisterDesc(uint64_t producer, const std::vector<uint64_t>& consumers, int32_t register_num,
                                     const std::vector<TensorMeta>& tensors) {
  if (!status_.ok()) return -1;
  proto::Task& producer_task = task(producer);
  if (register_num < 1 || register_num > kMaxRegisterNum) {
    Fail(absl::InvalidArgumentError(StrCat("task '", producer_task.name(), "': register_num ", register_num,
                                           " is outside [1, ", kMaxRegisterNum, "]")));
    return -1;
  }
  // The register's bytes, and their register_num copies (which the memory
  // estimate adds up), must fit.
  int64_t bytes = 0;
  absl::Status size = absl::OkStatus();
  for (const auto& meta : tensors) {
    absl::StatusOr<int64_t> sum = CheckedByteSize(meta);
    if (sum.ok()) sum = CheckedAdd(bytes, *sum, "register bytes");
    if (!sum.ok()) {
      size = sum.status();
      break;
    }
    bytes = *sum;
  }
  if (size.ok()) {
    size = CheckedMul(bytes, register_num, StrCat("register bytes x ", register_num, " registers")).status();
  }
  if (!size.ok()) {
    Fail(absl::InvalidArgumentError(StrCat("task '", producer_task.name(), "': ", size.message())));
    return -1;
  }
  const int64_t id = plan_.register_descs_size();
  proto::RegisterDesc* desc = plan_.add_register_descs();
  desc->set_id(id);
  desc->set_producer(producer);
  desc->set_register_num(register_num);
  for (const auto& meta : tensors) {
    proto::TensorDesc* t = desc->add_tensors();
    t->set_name(StrCat("t", desc->tensors_size() - 1));
    t->set_dtype(ToProto(meta.dtype));
    t->mutable_shape()->Add(meta.shape.dims().begin(), meta.shape.dims().end());
  }
  desc->set_bytes_per_register(producer_task.kind() == proto::ACTOR_KIND_REPEAT ? 0 : bytes);
  producer_task.add_produced_register_desc_ids(id);
  for (uint64_t consumer : consumers) {
    desc->add_consumers(consumer);
    task(consumer).add_consumed_register_desc_ids(id);
  }
  return id;
}

int64_t PlanBuilder::AddWindowDesc(uint64_t acc, const std::vector<uint64_t>& sources, int32_t window) {
  const int64_t id = AddRegisterDesc(acc, sources, window, {});
  if (id >= 0) plan_.mutable_register_descs(static_cast<int>(id))->set_window(window);
  return id;
}

void PlanBuilder::AddConsumer(int64_t desc_id, uint64_t consumer) {
  TESSERA_CHECK(desc_id >= 0 && desc_id < plan_.register_descs_size(), "no register desc ", desc_id);
  proto::RegisterDesc* desc = plan_.mutable_register_descs(static_cast<int>(desc_id));
  for (uint64_t c : desc->consumers()) {
    if (c == consumer) return;
  }
  desc->add_consumers(consumer);
  task(consumer).add_consumed_register_desc_ids(desc_id);
}

void PlanBuilder::AddInput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index) {
  proto::TensorRef* ref = task(actor_id).add_inputs();
  ref->set_register_desc_id(desc_id);
  ref->set_tensor_index(tensor_index);
}
void PlanBuilder::AddOutput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index) {
  proto::TensorRef* ref = task(actor_id).add_outputs();
  ref->set_register_desc_id(desc_id);
  ref->set_tensor_index(tensor_index);
}
void PlanBuilder::AddStateInput(uint64_t actor_id, int32_t state_index) {
  task(actor_id).add_inputs()->set_state_index(state_index);
}
void PlanBuilder::AddStateOutput(uint64_t actor_id, int32_t state_index) {
  task(actor_id).add_outputs()->set_state_index(state_index);
}
int32_t PlanBuilder::AddState(uint64_t actor_id, const TensorMeta& meta) {
  if (!status_.ok()) return -1;
  proto::Task& t = task(actor_id);
  if (auto bytes = CheckedByteSize(meta); !bytes.ok()) {
    Fail(absl::InvalidArgumentError(StrCat("task '", t.name(), "' state: ", bytes.status().message())));
    return -1;
  }
  proto::TensorDesc* desc = t.add_state();
  desc->set_name(StrCat("state", t.state_size() - 1));
  desc->set_dtype(ToProto(meta.dtype));
  desc->mutable_shape()->Add(meta.shape.dims().begin(), meta.shape.dims().end());
  return t.state_size() - 1;
}
void PlanBuilder::SetOp(uint64_t actor_id, std::string op, const ops::AttrMap& attrs) {
  proto::Task& t = task(actor_id);
  t.set_op(std::move(op));
  for (const auto& [name, value] : attrs.values()) (*t.mutable_attrs())[name] = ToProto(value);
}

void PlanBuilder::AddKept(uint64_t actor_id, const std::string& name, bool write) {
  proto::KeptTensor* kept = task(actor_id).add_kept();
  kept->set_name(name);
  kept->set_write(write);
}

void PlanBuilder::AddInitRule(uint64_t actor_id, const std::string& op, const ops::AttrMap& attrs,
                              const std::vector<TensorSlice>& slices) {
  proto::InitRule* rule = task(actor_id).add_init();
  rule->set_op(op);
  for (const auto& [name, value] : attrs.values()) (*rule->mutable_attrs())[name] = ToProto(value);
  for (const TensorSlice& slice : slices) *rule->add_slices() = ToProto(slice);
}

void PlanBuilder::SetSource(uint64_t actor_id, const std::string& input, const TensorMeta& logical,
                            const TensorSlice& slice) {
  proto::SourceDesc* source = task(actor_id).mutable_source();
  source->set_input(input);
  *source->mutable_logical() = ToProto(logical, input);
  *source->mutable_slice() = ToProto(slice);
}

proto::Plan PlanBuilder::Build() {
  proto::Plan plan = plan_;
  if (!status_.ok()) return plan;
  auto planned = PlanMemory(plan);
  if (!planned.ok()) {
    Fail(planned.status());
    return plan;
  }
  memory_note_ = !planned->unshared_reason.empty() ? StrCat("no arena bytes are shared: ", planned->unshared_reason)
                                                   : planned->partly_unshared_reason;
  if (!memory_note_.empty()) TLOG_WARN("memory plan: {}", memory_note_);
  plan.set_memory_note(memory_note_);
  auto estimate = EstimateMemory(plan);
  if (!estimate.ok()) {
    Fail(estimate.status());
    return plan;
  }
  for (auto& m : *estimate) *plan.add_memory_estimate() = std::move(m);
  Fail(CheckPlanSize(plan));
  return plan;
}

}  // namespace tessera::comm
