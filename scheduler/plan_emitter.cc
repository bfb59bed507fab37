#include "scheduler/plan_emitter.h"

#include <type_traits>
#include <utility>
#include <variant>

#include "core/status.h"

namespace tessera::scheduler {
namespace {

// DESIGN §7 actor id layout, from the least significant bit up.
constexpr int kTaskBits = 24, kStreamBits = 12, kDeviceIndexBits = 8;
constexpr int kStreamShift = kTaskBits;
constexpr int kDeviceIndexShift = kStreamShift + kStreamBits;
constexpr int kDeviceTypeShift = kDeviceIndexShift + kDeviceIndexBits;
constexpr int kNodeShift = kDeviceTypeShift + 4;

int64_t Bytes(const TensorMeta& meta) { return meta.shape.NumElements() * static_cast<int64_t>(DTypeSize(meta.dtype)); }

}  // namespace

proto::DType DTypeToProto(DType dtype) {
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

proto::AttrValue AttrToProto(const ops::AttrValue& value) {
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
          out.set_dtype(DTypeToProto(v));
        }
      },
      value);
  return out;
}

uint64_t CpuActorId(uint32_t device_index, uint32_t stream, uint32_t task) {
  TESSERA_CHECK(device_index < (1u << kDeviceIndexBits) && stream < (1u << kStreamBits) && task < (1u << kTaskBits),
                "actor id field out of range: device ", device_index, " stream ", stream, " task ", task);
  // node 0, device type 0 (cpu).
  return (uint64_t{0} << kNodeShift) | (uint64_t{0} << kDeviceTypeShift) | (uint64_t{device_index} << kDeviceIndexShift) |
         (uint64_t{stream} << kStreamShift) | uint64_t{task};
}

std::vector<proto::DeviceMemory> EstimatePlanMemory(const proto::Plan& plan) {
  std::map<std::pair<uint32_t, uint64_t>, int64_t> bytes;  // (node, device type|index) -> bytes
  const auto key = [](uint64_t id) {
    return std::pair<uint32_t, uint64_t>{static_cast<uint32_t>(id >> kNodeShift), (id >> kDeviceIndexShift) & 0xfff};
  };
  for (const auto& desc : plan.register_descs()) bytes[key(desc.producer())] += desc.bytes_per_register() * desc.register_num();
  for (const auto& task : plan.tasks()) {
    for (const auto& state : task.state()) {
      int64_t n = 1;
      for (int64_t d : state.shape()) n *= d;
      const int64_t size = state.dtype() == proto::DTYPE_F32 || state.dtype() == proto::DTYPE_I32 ? 4
                           : state.dtype() == proto::DTYPE_I64                                     ? 8
                           : state.dtype() == proto::DTYPE_BOOL                                    ? 1
                                                                                                   : 2;
      bytes[key(task.actor_id())] += n * size;
    }
  }
  std::vector<proto::DeviceMemory> out;
  for (const auto& [k, total] : bytes) {
    proto::DeviceMemory m;
    m.set_node(k.first);
    const uint64_t type = k.second >> kDeviceIndexBits, index = k.second & ((1u << kDeviceIndexBits) - 1);
    m.set_device(StrCat(type == 0 ? "cpu" : "cuda", ":", index));
    m.set_bytes(total);
    out.push_back(std::move(m));
  }
  return out;
}

uint64_t PlanEmitter::AddTask(proto::ActorKind kind, std::string name, uint32_t stream, uint32_t device_index) {
  const uint64_t prefix = CpuActorId(device_index, stream, 0);
  const uint64_t id = CpuActorId(device_index, stream, next_task_[prefix]++);
  index_[id] = plan_.tasks_size();
  proto::Task* task = plan_.add_tasks();
  task->set_actor_id(id);
  task->set_kind(kind);
  task->set_name(std::move(name));
  return id;
}

proto::Task& PlanEmitter::task(uint64_t actor_id) {
  auto it = index_.find(actor_id);
  TESSERA_CHECK(it != index_.end(), "no task ", actor_id);
  return *plan_.mutable_tasks(it->second);
}

int64_t PlanEmitter::AddRegisterDesc(uint64_t producer, const std::vector<uint64_t>& consumers, int32_t register_num,
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
    t->set_dtype(DTypeToProto(meta.dtype));
    t->mutable_shape()->Add(meta.shape.dims().begin(), meta.shape.dims().end());
    bytes += Bytes(meta);
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

void PlanEmitter::AddInput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index) {
  proto::TensorRef* ref = task(actor_id).add_inputs();
  ref->set_register_desc_id(desc_id);
  ref->set_tensor_index(tensor_index);
}
void PlanEmitter::AddOutput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index) {
  proto::TensorRef* ref = task(actor_id).add_outputs();
  ref->set_register_desc_id(desc_id);
  ref->set_tensor_index(tensor_index);
}
void PlanEmitter::AddStateInput(uint64_t actor_id, int32_t state_index) { task(actor_id).add_inputs()->set_state_index(state_index); }
void PlanEmitter::AddStateOutput(uint64_t actor_id, int32_t state_index) { task(actor_id).add_outputs()->set_state_index(state_index); }

int32_t PlanEmitter::AddState(uint64_t actor_id, const TensorMeta& meta) {
  proto::Task& t = task(actor_id);
  proto::TensorDesc* desc = t.add_state();
  desc->set_name(StrCat("state", t.state_size() - 1));
  desc->set_dtype(DTypeToProto(meta.dtype));
  desc->mutable_shape()->Add(meta.shape.dims().begin(), meta.shape.dims().end());
  return t.state_size() - 1;
}

void PlanEmitter::SetOp(uint64_t actor_id, std::string op, const ops::AttrMap& attrs) {
  proto::Task& t = task(actor_id);
  t.set_op(std::move(op));
  for (const auto& [name, value] : attrs.values()) (*t.mutable_attrs())[name] = AttrToProto(value);
}

proto::Plan PlanEmitter::Build() const {
  proto::Plan plan = plan_;
  for (auto& m : EstimatePlanMemory(plan)) *plan.add_memory_estimate() = std::move(m);
  return plan;
}

}  // namespace tessera::scheduler
