#include "comm/proto/plan_codec.h"

#include <map>
#include <utility>

#include "comm/proto/actor_id.h"
#include "core/status.h"
#include "core/text.h"

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
  for (int64_t d : desc.shape()) {
    if (d < 0) return absl::InvalidArgumentError(StrCat("tensor '", desc.name(), "' has a negative extent"));
  }
  return TensorMeta{dtype, Shape(ToVector(desc.shape()))};
}

absl::StatusOr<TensorSlice> TensorSliceFromProto(const proto::TensorSlice& slice, const Shape& local) {
  if (slice.logical_shape().empty() && slice.offset().empty()) return TensorSlice::Whole(local);
  TensorSlice out;
  out.logical = Shape(ToVector(slice.logical_shape()));
  out.offset = ToVector(slice.offset());
  out.local = local;
  if (out.logical.rank() != local.rank() || static_cast<int>(out.offset.size()) != local.rank()) {
    return absl::InvalidArgumentError(StrCat("tensor slice rank mismatch: logical ", out.logical.ToString(),
                                             ", offset of ", out.offset.size(), " axes, local ", local.ToString()));
  }
  for (int a = 0; a < local.rank(); ++a) {
    if (out.offset[static_cast<size_t>(a)] < 0 || out.offset[static_cast<size_t>(a)] + local[a] > out.logical[a]) {
      return absl::InvalidArgumentError(StrCat("tensor slice out of range on axis ", a, ": offset ",
                                               out.offset[static_cast<size_t>(a)], " + local ", local[a],
                                               " > logical ", out.logical[a]));
    }
  }
  return out;
}

std::string SerializePlan(const proto::Plan& plan) {
  std::string bytes;
  TESSERA_CHECK(plan.SerializeToString(&bytes), "plan serialisation failed");
  return bytes;
}

absl::StatusOr<proto::Plan> ParsePlan(std::string_view bytes) {
  proto::Plan plan;
  if (!plan.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(StrCat("cannot parse plan (", bytes.size(), " bytes)"));
  }
  return plan;
}

std::vector<proto::DeviceMemory> EstimateMemory(const proto::Plan& plan) {
  std::map<std::pair<uint32_t, std::string>, int64_t> bytes;
  for (const auto& desc : plan.register_descs()) {
    const ActorId producer = DecodeActorId(desc.producer());
    bytes[{producer.node, producer.device().ToString()}] += desc.bytes_per_register() * desc.register_num();
  }
  for (const auto& task : plan.tasks()) {
    const ActorId id = DecodeActorId(task.actor_id());
    for (const auto& state : task.state()) {
      auto meta = TensorMetaFromProto(state);
      if (meta.ok()) {
        bytes[{id.node, id.device().ToString()}] +=
            meta->shape.NumElements() * static_cast<int64_t>(DTypeSize(meta->dtype));
      }
    }
  }
  std::vector<proto::DeviceMemory> out;
  for (const auto& [key, total] : bytes) {
    proto::DeviceMemory m;
    m.set_node(key.first);
    m.set_device(key.second);
    m.set_bytes(total);
    out.push_back(std::move(m));
  }
  return out;
}

uint64_t PlanBuilder::AddTask(proto::ActorKind kind, std::string name, uint32_t stream, uint32_t device_index) {
  ActorId id;
  id.device_index = device_index;
  id.stream = stream;
  auto base = EncodeActorId(id);
  TESSERA_CHECK(base.ok(), base.status().ToString());
  id.task = next_task_[StreamOf(*base)]++;
  auto encoded = EncodeActorId(id);
  TESSERA_CHECK(encoded.ok(), encoded.status().ToString());
  index_[*encoded] = plan_.tasks_size();
  proto::Task* task = plan_.add_tasks();
  task->set_actor_id(*encoded);
  task->set_kind(kind);
  task->set_name(std::move(name));
  return *encoded;
}

proto::Task& PlanBuilder::task(uint64_t actor_id) {
  auto it = index_.find(actor_id);
  TESSERA_CHECK(it != index_.end(), "no task ", ActorIdToString(actor_id));
  return *plan_.mutable_tasks(it->second);
}

int64_t PlanBuilder::AddRegisterDesc(uint64_t producer, const std::vector<uint64_t>& consumers, int32_t register_num,
                                     const std::vector<TensorMeta>& tensors) {
  const int64_t id = plan_.register_descs_size();
  proto::RegisterDesc* desc = plan_.add_register_descs();
  desc->set_id(id);
  desc->set_producer(producer);
  desc->set_register_num(register_num);
  int64_t bytes = 0;
  for (const auto& meta : tensors) {
    proto::TensorDesc* t = desc->add_tensors();
    t->set_name(StrCat("t", desc->tensors_size() - 1));
    t->set_dtype(ToProto(meta.dtype));
    t->mutable_shape()->Add(meta.shape.dims().begin(), meta.shape.dims().end());
    bytes += meta.shape.NumElements() * static_cast<int64_t>(DTypeSize(meta.dtype));
  }
  proto::Task& producer_task = task(producer);
  desc->set_bytes_per_register(producer_task.kind() == proto::ACTOR_KIND_REPEAT ? 0 : bytes);
  producer_task.add_produced_register_desc_ids(id);
  for (uint64_t consumer : consumers) {
    desc->add_consumers(consumer);
    task(consumer).add_consumed_register_desc_ids(id);
  }
  return id;
}

void PlanBuilder::AddConsumer(int64_t desc_id, uint64_t consumer) {
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
  proto::Task& t = task(actor_id);
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

proto::Plan PlanBuilder::Build() const {
  proto::Plan plan = plan_;
  for (auto& m : EstimateMemory(plan)) *plan.add_memory_estimate() = std::move(m);
  return plan;
}

}  // namespace tessera::comm
