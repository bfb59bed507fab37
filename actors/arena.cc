#include "actors/arena.h"

#include <cstdlib>
#include <cstring>

#include "actors/actor_id.h"
#include "actors/plan.h"
#include "comm/proto/memory_plan.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::actors {

bool ArenaCheckFromEnvironment() {
  const char* value = std::getenv("TESSERA_CHECK_ARENA");
  return value != nullptr && std::string_view(value) == "1";
}

absl::StatusOr<std::map<int64_t, std::vector<std::vector<Tensor>>>> ArenaMonitor::Allocate(const proto::Plan& plan,
                                                                                           uint32_t node) {
  RETURN_IF_ERROR(comm::CheckArenaBounds(plan));
  std::map<uint32_t, size_t> device_of;  // device index -> devices_
  std::map<uint32_t, Device*> by_index;
  for (const auto& arena : plan.arenas()) {
    if (arena.node() != node) continue;
    auto device = std::make_unique<Device>();
    device->index = arena.device_index();
    device->bytes = arena.bytes();
    device_of[arena.device_index()] = devices_.size();
    by_index[arena.device_index()] = device.get();
    devices_.push_back(std::move(device));
  }
  std::map<int64_t, std::vector<std::vector<Tensor>>> out;
  std::unordered_map<uint64_t, const proto::Task*> task_of;
  for (const auto& task : plan.tasks()) task_of[task.actor_id()] = &task;
  const auto task_name = [&task_of](uint64_t actor_id) {
    auto it = task_of.find(actor_id);
    return it == task_of.end() ? ActorIdToString(actor_id) : StrCat("'", it->second->name(), "'");
  };
  // The device's arena, allocated (zero-filled) when first needed.
  const auto arena_of = [&](const ActorId& actor) -> absl::StatusOr<Device*> {
    Device* device = by_index.at(actor.device_index);  // CheckArenaBounds: the device has an arena
    if (device->storage != nullptr) return device;
    const auto bytes = static_cast<size_t>(std::max<int64_t>(device->bytes, 1));
    auto storage = Storage::CreateZeroed(actor.device(), bytes);
    if (!storage.ok()) {
      return absl::Status(storage.status().code(), StrCat("allocating the arena of ", actor.device().ToString(), " (",
                                                          device->bytes, " bytes): ", storage.status().message()));
    }
    device->storage = *std::move(storage);
    device->host = actor.device().type == DeviceType::kCpu;
    return device;
  };
  for (const auto& desc : plan.register_descs()) {
    if (!desc.has_arena_offset()) continue;
    const ActorId producer = DecodeActorId(desc.producer());
    if (producer.node != node) continue;
    ASSIGN_OR_RETURN(Device * device, arena_of(producer));
    ASSIGN_OR_RETURN(const int64_t stride, comm::RegisterStride(desc));
    std::vector<Register>& registers = registers_[desc.id()];
    std::vector<std::vector<Tensor>>& tensors = out[desc.id()];
    for (int r = 0; r < desc.register_num(); ++r) {
      const int64_t begin = desc.arena_offset() + r * stride;
      std::vector<Tensor> held;
      int64_t at = begin;
      for (const auto& t : desc.tensors()) {
        ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(t));
        ASSIGN_OR_RETURN(Tensor tensor, Tensor::InStorage(device->storage, static_cast<size_t>(at), meta));
        at += (static_cast<int64_t>(tensor.NumBytes()) + comm::kArenaAlignment - 1) / comm::kArenaAlignment *
              comm::kArenaAlignment;
        held.push_back(std::move(tensor));
      }
      tensors.push_back(std::move(held));
      Register reg;
      reg.device = device_of.at(producer.device_index);
      reg.begin = begin;
      reg.bytes = stride;
      reg.data = static_cast<char*>(device->storage->data()) + begin;
      reg.desc_id = desc.id();
      reg.index = r;
      reg.name = StrCat("register ", r, " of desc ", desc.id(), " (", task_name(desc.producer()), ")");
      reg.readers = std::max(1, desc.consumers_size());
      registers.push_back(std::move(reg));
    }
  }
  for (const auto& task : plan.tasks()) {
    if (!task.has_scratch_offset()) continue;
    const ActorId actor = DecodeActorId(task.actor_id());
    if (actor.node != node) continue;
    ASSIGN_OR_RETURN(Device * device, arena_of(actor));
    ScratchUse& use = scratch_[task.actor_id()];
    // A byte buffer as f32 words (the routine carves typed buffers from it).
    const int64_t words = (task.scratch_bytes() + 3) / 4;
    ASSIGN_OR_RETURN(use.tensor, Tensor::InStorage(device->storage, static_cast<size_t>(task.scratch_offset()),
                                                   TensorMeta{DType::kF32, Shape{words}}));
    use.reg.device = device_of.at(actor.device_index);
    use.reg.begin = task.scratch_offset();
    use.reg.bytes = words * 4;
    use.reg.data = static_cast<char*>(device->storage->data()) + task.scratch_offset();
    use.reg.desc_id = -1;
    use.reg.index = 0;
    use.reg.name = StrCat("the scratch of '", task.name(), "'");
  }
  return out;
}

Tensor ArenaMonitor::Scratch(uint64_t actor_id) const {
  auto it = scratch_.find(actor_id);
  return it == scratch_.end() ? Tensor() : it->second.tensor;
}

void ArenaMonitor::ClaimScratch(uint64_t actor_id) {
  auto it = scratch_.find(actor_id);
  if (it != scratch_.end()) ClaimRegister(&it->second.reg);
}

void ArenaMonitor::ReleaseScratch(uint64_t actor_id) {
  auto it = scratch_.find(actor_id);
  if (it != scratch_.end()) ReleaseRegister(&it->second.reg);
}

const ArenaMonitor::Register* ArenaMonitor::Find(int64_t desc_id, int32_t index) const {
  auto it = registers_.find(desc_id);
  if (it == registers_.end() || index < 0 || static_cast<size_t>(index) >= it->second.size()) return nullptr;
  return &it->second[static_cast<size_t>(index)];
}

void ArenaMonitor::Claim(int64_t desc_id, int32_t index) {
  const Register* reg = Find(desc_id, index);
  if (reg != nullptr) ClaimRegister(reg);
}

void ArenaMonitor::Release(int64_t desc_id, int32_t index) {
  const Register* reg = Find(desc_id, index);
  if (reg != nullptr && reg->pending->fetch_sub(1) == 1) ReleaseRegister(reg);
}

void ArenaMonitor::ClaimRegister(const Register* reg) {
  Device& device = *devices_[reg->device];
  reg->pending->store(reg->readers, std::memory_order_relaxed);
  const int64_t live = device.live.fetch_add(reg->bytes, std::memory_order_relaxed) + reg->bytes;
  int64_t peak = device.peak.load(std::memory_order_relaxed);
  while (live > peak && !device.peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  if (!check_) return;
  std::string overlap;
  {
    std::lock_guard<std::mutex> lock(device.mu);
    auto next = device.in_use.lower_bound(reg->begin);
    if (next != device.in_use.end() && next->first < reg->begin + reg->bytes) {
      overlap = next->second->name;
    } else if (next != device.in_use.begin() && std::prev(next)->first + std::prev(next)->second->bytes > reg->begin) {
      overlap = std::prev(next)->second->name;
    }
    if (overlap.empty()) device.in_use.emplace(reg->begin, reg);
  }
  if (overlap.empty()) return;
  absl::Status first;
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    if (!status_.ok()) return;
    status_ = absl::InternalError(StrCat("arena check: ", reg->name, " (arena bytes [", reg->begin, ", ",
                                         reg->begin + reg->bytes, ") of ", device.host ? "cpu:" : "cuda:", device.index,
                                         ") was taken while ", overlap, ", sharing its bytes, was in use"));
    first = status_;
  }
  if (on_violation_) on_violation_(first);
}

void ArenaMonitor::ReleaseRegister(const Register* reg) {
  Device& device = *devices_[reg->device];
  device.live.fetch_sub(reg->bytes, std::memory_order_relaxed);
  if (!check_) return;
  if (device.host) std::memset(reg->data, 0xFF, static_cast<size_t>(reg->bytes));
  std::lock_guard<std::mutex> lock(device.mu);
  auto it = device.in_use.find(reg->begin);
  if (it != device.in_use.end() && it->second == reg) device.in_use.erase(it);
}

absl::Status ArenaMonitor::status() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

std::vector<ArenaMonitor::Use> ArenaMonitor::Uses() const {
  std::lock_guard<std::mutex> lock(held_mu_);
  std::vector<Use> out;
  for (const auto& device : devices_) {
    Use use{device->index, device->bytes, device->peak.load()};
    if (auto it = held_.find(device->index); it != held_.end()) {
      use.parameter_bytes = it->second.first;
      use.optimizer_state_bytes = it->second.second;
    }
    out.push_back(use);
  }
  return out;
}

void ArenaMonitor::CountHeld(uint32_t device_index, int64_t parameter_bytes, int64_t optimizer_state_bytes) {
  std::lock_guard<std::mutex> lock(held_mu_);
  auto& held = held_[device_index];
  held.first += parameter_bytes;
  held.second += optimizer_state_bytes;
}

}  // namespace tessera::actors
