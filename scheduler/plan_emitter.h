#pragma once
// Emits a proto::Plan task by task for the scheduler, which must not depend
// on actors/ (DESIGN §2: the plan proto is the only contract between the
// two). Actor ids follow the DESIGN §7 layout (node 16 | device type 4 |
// device index 8 | stream 12 | task 24), tasks numbered per stream in call
// order; register desc ids in call order. Build() fills in the per-device
// memory estimate: register bytes x quota of each producer's device, plus
// Parameter state. Not thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/proto/plan.pb.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/attr.h"

namespace tessera::scheduler {

proto::DType DTypeToProto(DType dtype);
proto::AttrValue AttrToProto(const ops::AttrValue& value);
// Node 0, CPU device `device_index`.
uint64_t CpuActorId(uint32_t device_index, uint32_t stream, uint32_t task);
// The memory estimate of a plan (what Build() stores).
std::vector<proto::DeviceMemory> EstimatePlanMemory(const proto::Plan& plan);

class PlanEmitter {
 public:
  explicit PlanEmitter(int64_t iterations) { plan_.set_iterations(iterations); }

  uint64_t AddTask(proto::ActorKind kind, std::string name, uint32_t stream, uint32_t device_index);
  proto::Task& task(uint64_t actor_id);
  int64_t AddRegisterDesc(uint64_t producer, const std::vector<uint64_t>& consumers, int32_t register_num,
                          const std::vector<TensorMeta>& tensors);
  void AddInput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index);
  void AddOutput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index);
  void AddStateInput(uint64_t actor_id, int32_t state_index);
  void AddStateOutput(uint64_t actor_id, int32_t state_index);
  int32_t AddState(uint64_t actor_id, const TensorMeta& meta);
  void SetOp(uint64_t actor_id, std::string op, const ops::AttrMap& attrs);
  proto::Plan Build() const;

 private:
  proto::Plan plan_;
  std::map<uint64_t, int> index_;               // actor id -> task index
  std::map<uint64_t, uint32_t> next_task_;      // stream prefix -> next task number
};

}  // namespace tessera::scheduler
