#include "actors/plan.h"

#include <map>
#include <set>

#include "actors/actor_id.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/text.h"

namespace tessera::actors {
namespace {

template <typename Repeated>
std::vector<int64_t> ToVector(const Repeated& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

std::string TaskName(const proto::Task& task) {
  return StrCat("task '", task.name(), "' (", ActorIdToString(task.actor_id()), ")");
}

size_t Count(const google::protobuf::RepeatedField<int64_t>& ids, int64_t id) {
  size_t n = 0;
  for (int64_t x : ids) n += x == id;
  return n;
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

namespace {

absl::Status ValidateTask(const proto::Task& task, const std::map<int64_t, const proto::RegisterDesc*>& descs,
                          const ops::OpRegistry& registry) {
  const std::string name = TaskName(task);
  for (int64_t id : task.consumed_register_desc_ids()) {
    auto it = descs.find(id);
    if (it == descs.end()) return absl::InvalidArgumentError(StrCat(name, " consumes unknown register desc ", id));
    bool listed = false;
    for (uint64_t c : it->second->consumers()) listed |= c == task.actor_id();
    if (!listed) return absl::InvalidArgumentError(StrCat(name, " consumes desc ", id, " which does not list it"));
    if (Count(task.consumed_register_desc_ids(), id) != 1) {
      return absl::InvalidArgumentError(StrCat(name, " consumes desc ", id, " twice"));
    }
  }
  for (int64_t id : task.produced_register_desc_ids()) {
    auto it = descs.find(id);
    if (it == descs.end()) return absl::InvalidArgumentError(StrCat(name, " produces unknown register desc ", id));
    if (it->second->producer() != task.actor_id()) {
      return absl::InvalidArgumentError(StrCat(name, " produces desc ", id, " whose producer is another actor"));
    }
  }
  // Metas of the op's inputs / outputs, resolved through the refs.
  auto resolve = [&](const proto::TensorRef& ref, std::vector<TensorMeta>* metas,
                     bool output) -> absl::Status {
    if (ref.location_case() == proto::TensorRef::kStateIndex) {
      if (ref.state_index() < 0 || ref.state_index() >= task.state_size()) {
        return absl::InvalidArgumentError(StrCat(name, " refers to state tensor ", ref.state_index(), " of ",
                                                 task.state_size()));
      }
      ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(task.state(ref.state_index())));
      metas->push_back(std::move(meta));
      return absl::OkStatus();
    }
    const int64_t id = ref.register_desc_id();
    const auto& own = output ? task.produced_register_desc_ids() : task.consumed_register_desc_ids();
    bool in_own = Count(own, id) > 0;
    // A Parameter's update writes its variable (a produced desc) and reads it.
    if (!in_own && task.kind() == proto::ACTOR_KIND_PARAMETER) in_own = Count(task.produced_register_desc_ids(), id) > 0;
    if (!in_own) {
      return absl::InvalidArgumentError(StrCat(name, " ", output ? "output" : "input", " refers to desc ", id,
                                               " which it does not ", output ? "produce" : "consume"));
    }
    const proto::RegisterDesc& desc = *descs.at(id);
    if (ref.tensor_index() < 0 || ref.tensor_index() >= desc.tensors_size()) {
      return absl::InvalidArgumentError(StrCat(name, " refers to tensor ", ref.tensor_index(), " of desc ", id,
                                               " which holds ", desc.tensors_size()));
    }
    ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(desc.tensors(ref.tensor_index())));
    auto slice = TensorSliceFromProto(ref.slice(), meta.shape);
    if (!slice.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", slice.status().message()));
    metas->push_back(std::move(meta));
    return absl::OkStatus();
  };
  std::vector<TensorMeta> inputs, outputs;
  for (const auto& ref : task.inputs()) RETURN_IF_ERROR(resolve(ref, &inputs, false));
  for (const auto& ref : task.outputs()) RETURN_IF_ERROR(resolve(ref, &outputs, true));

  const auto single_in_out = [&]() -> absl::Status {
    if (task.consumed_register_desc_ids_size() != 1 || task.produced_register_desc_ids_size() != 1) {
      return absl::InvalidArgumentError(StrCat(name, " must consume and produce exactly one register desc"));
    }
    if (task.repeat_num() < 1) return absl::InvalidArgumentError(StrCat(name, " needs repeat_num >= 1"));
    return absl::OkStatus();
  };
  switch (task.kind()) {
    case proto::ACTOR_KIND_SOURCE:
      if (task.consumed_register_desc_ids_size() != 0) {
        return absl::InvalidArgumentError(StrCat(name, ": a source consumes nothing"));
      }
      break;
    case proto::ACTOR_KIND_SINK:
      if (task.produced_register_desc_ids_size() != 0 || task.consumed_register_desc_ids_size() == 0) {
        return absl::InvalidArgumentError(StrCat(name, ": a sink consumes at least one desc and produces none"));
      }
      break;
    case proto::ACTOR_KIND_COMPUTE:
    case proto::ACTOR_KIND_PARAMETER: {
      if (task.kind() == proto::ACTOR_KIND_COMPUTE && task.consumed_register_desc_ids_size() == 0) {
        return absl::InvalidArgumentError(StrCat(name, ": a compute actor consumes at least one desc"));
      }
      if (task.kind() == proto::ACTOR_KIND_PARAMETER) {
        if (task.produced_register_desc_ids_size() != 1 || descs.at(task.produced_register_desc_ids(0))->register_num() != 1) {
          return absl::InvalidArgumentError(StrCat(name, ": a parameter produces exactly one desc, with register_num 1"));
        }
      }
      if (task.op().empty()) {
        if (task.inputs_size() != 0 || task.outputs_size() != 0) {
          return absl::InvalidArgumentError(StrCat(name, " has tensor refs but no op"));
        }
        break;
      }
      auto schema = registry.Get(task.op());
      if (!schema.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", schema.status().message()));
      auto attrs = AttrMapFromProto(task.attrs());
      if (!attrs.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", attrs.status().message()));
      auto canonical = (*schema)->CanonicalizeAttrs(*attrs);
      if (!canonical.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", canonical.status().message()));
      auto inferred = (*schema)->InferMeta(inputs, *canonical);
      if (!inferred.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", inferred.status().message()));
      if (*inferred != outputs) {
        std::vector<std::string> want, have;
        for (const auto& m : *inferred) want.push_back(m.ToString());
        for (const auto& m : outputs) have.push_back(m.ToString());
        return absl::InvalidArgumentError(StrCat(name, ": op '", task.op(), "' gives outputs [", Join(want, ", "),
                                                 "] but the plan's registers hold [", Join(have, ", "), "]"));
      }
      break;
    }
    case proto::ACTOR_KIND_REPEAT: {
      RETURN_IF_ERROR(single_in_out());
      const auto& in = *descs.at(task.consumed_register_desc_ids(0));
      const auto& out = *descs.at(task.produced_register_desc_ids(0));
      if (in.tensors_size() != out.tensors_size()) {
        return absl::InvalidArgumentError(StrCat(name, ": repeat must produce as many tensors as it consumes"));
      }
      for (int i = 0; i < in.tensors_size(); ++i) {
        ASSIGN_OR_RETURN(TensorMeta a, TensorMetaFromProto(in.tensors(i)));
        ASSIGN_OR_RETURN(TensorMeta b, TensorMetaFromProto(out.tensors(i)));
        bool ok = a == b;  // the same tensor m times
        if (!ok && a.dtype == b.dtype && a.shape.rank() >= 1 && a.shape.rank() == b.shape.rank()) {
          Shape scaled = b.shape;
          scaled[0] *= task.repeat_num();
          ok = scaled == a.shape;  // m row pieces
        }
        if (!ok) {
          return absl::InvalidArgumentError(StrCat(name, ": tensor ", i, " ", b.ToString(), " is neither ",
                                                   a.ToString(), " nor 1/", task.repeat_num(), " of its rows"));
        }
      }
      break;
    }
    case proto::ACTOR_KIND_ACC: {
      RETURN_IF_ERROR(single_in_out());
      const auto& in = *descs.at(task.consumed_register_desc_ids(0));
      const auto& out = *descs.at(task.produced_register_desc_ids(0));
      bool same = in.tensors_size() == out.tensors_size();
      for (int i = 0; same && i < in.tensors_size(); ++i) {
        same = in.tensors(i).dtype() == out.tensors(i).dtype() &&
               ToVector(in.tensors(i).shape()) == ToVector(out.tensors(i).shape());
      }
      if (!same) return absl::InvalidArgumentError(StrCat(name, ": acc must produce the tensors it consumes"));
      break;
    }
    default:
      return absl::InvalidArgumentError(StrCat(name, " has no kind"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlan(const proto::Plan& plan, const ops::OpRegistry& registry) {
  if (plan.iterations() < 0) return absl::InvalidArgumentError("plan has negative iterations");
  std::map<uint64_t, const proto::Task*> tasks;
  for (const auto& task : plan.tasks()) {
    RETURN_IF_ERROR(ValidateActorId(task.actor_id()));
    if (!tasks.emplace(task.actor_id(), &task).second) {
      return absl::InvalidArgumentError(StrCat("two tasks have actor id ", ActorIdToString(task.actor_id())));
    }
  }
  std::map<int64_t, const proto::RegisterDesc*> descs;
  for (const auto& desc : plan.register_descs()) {
    const std::string name = StrCat("register desc ", desc.id());
    if (!descs.emplace(desc.id(), &desc).second) return absl::InvalidArgumentError(StrCat("two ", name, "s"));
    if (desc.register_num() < 1) return absl::InvalidArgumentError(StrCat(name, " has register_num < 1"));
    auto producer = tasks.find(desc.producer());
    if (producer == tasks.end() || Count(producer->second->produced_register_desc_ids(), desc.id()) != 1) {
      return absl::InvalidArgumentError(StrCat(name, ": producer ", ActorIdToString(desc.producer()),
                                               " is not a task producing it once"));
    }
    std::set<uint64_t> seen;
    for (uint64_t consumer : desc.consumers()) {
      auto it = tasks.find(consumer);
      if (it == tasks.end() || Count(it->second->consumed_register_desc_ids(), desc.id()) != 1) {
        return absl::InvalidArgumentError(
            StrCat(name, ": consumer ", ActorIdToString(consumer), " is not a task consuming it"));
      }
      if (!seen.insert(consumer).second) return absl::InvalidArgumentError(StrCat(name, " lists a consumer twice"));
    }
    int64_t bytes = 0;
    for (const auto& tensor : desc.tensors()) {
      auto meta = TensorMetaFromProto(tensor);
      if (!meta.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", meta.status().message()));
      bytes += meta->shape.NumElements() * static_cast<int64_t>(DTypeSize(meta->dtype));
    }
    const bool view = producer->second->kind() == proto::ACTOR_KIND_REPEAT;
    if (desc.bytes_per_register() != (view ? 0 : bytes)) {
      return absl::InvalidArgumentError(StrCat(name, " says ", desc.bytes_per_register(), " bytes per register, its tensors hold ",
                                               view ? 0 : bytes));
    }
  }
  for (const auto& task : plan.tasks()) RETURN_IF_ERROR(ValidateTask(task, descs, registry));
  return absl::OkStatus();
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
  proto::Task* task = plan_.add_tasks();
  task->set_actor_id(*encoded);
  task->set_kind(kind);
  task->set_name(std::move(name));
  return *encoded;
}

proto::Task& PlanBuilder::task(uint64_t actor_id) {
  for (auto& task : *plan_.mutable_tasks()) {
    if (task.actor_id() == actor_id) return task;
  }
  TESSERA_CHECK(false, "no task ", ActorIdToString(actor_id));
  return *plan_.mutable_tasks(0);
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

}  // namespace tessera::actors
