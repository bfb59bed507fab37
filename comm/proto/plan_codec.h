#pragma once
// The physical plan's codec, shared by the scheduler (which writes plans) and
// the actor runtime (which reads them): conversions between proto and core
// types, serialisation, and the per-device memory estimate. The plan proto is
// the only contract between the two (DESIGN §2).

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"
#include "core/dtype.h"
#include "core/sbp.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "ops/attr.h"

namespace tessera::comm {

proto::DType ToProto(DType dtype);
absl::StatusOr<DType> FromProto(proto::DType dtype);
proto::AttrValue ToProto(const ops::AttrValue& value);
absl::StatusOr<ops::AttrValue> FromProto(const proto::AttrValue& value);
absl::StatusOr<ops::AttrMap> AttrMapFromProto(const google::protobuf::Map<std::string, proto::AttrValue>& attrs);
absl::StatusOr<TensorMeta> TensorMetaFromProto(const proto::TensorDesc& desc);
// The slice of a TensorRef; an empty proto slice is the whole `local` shape.
absl::StatusOr<TensorSlice> TensorSliceFromProto(const proto::TensorSlice& slice, const Shape& local);

// Registers a task produces per iteration: pieces_per_iteration, 0 read as 1.
inline int64_t PiecesPerIteration(const proto::Task& task) {
  return task.pieces_per_iteration() > 1 ? task.pieces_per_iteration() : 1;
}

std::string SerializePlan(const proto::Plan& plan);
absl::StatusOr<proto::Plan> ParsePlan(std::string_view bytes);

// Register bytes x quota per (node, device) of the producing actors, plus
// Parameter state.
std::vector<proto::DeviceMemory> EstimateMemory(const proto::Plan& plan);


// Builds plans task by task (the scheduler; tests and benchmarks by hand). Ids are assigned in call order; errors surface in
// ValidatePlan, not here.
class PlanBuilder {
 public:
  explicit PlanBuilder(int64_t iterations) { plan_.set_iterations(iterations); }

  // Adds a task on (node 0, cpu:device_index, stream) with the next task
  // index of that stream; returns its actor id.
  uint64_t AddTask(proto::ActorKind kind, std::string name, uint32_t stream = 0, uint32_t device_index = 0);
  proto::Task& task(uint64_t actor_id);

  // A register desc produced by `producer`, read by `consumers`, holding
  // `tensors` (dtype, local shape); registers the ids on both sides.
  int64_t AddRegisterDesc(uint64_t producer, const std::vector<uint64_t>& consumers, int32_t register_num,
                          const std::vector<TensorMeta>& tensors);

  // Adds `consumer` as a reader of desc `desc_id` (once: a second call for
  // the same pair does nothing).
  void AddConsumer(int64_t desc_id, uint64_t consumer);

  // Appends an op input / output referring to tensor `tensor_index` of desc.
  void AddInput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index = 0);
  void AddOutput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index = 0);
  // Parameter actors: an input / output referring to state tensor `state_index`.
  void AddStateInput(uint64_t actor_id, int32_t state_index);
  void AddStateOutput(uint64_t actor_id, int32_t state_index);
  // Parameter actors: adds an optimizer state tensor; returns its index.
  int32_t AddState(uint64_t actor_id, const TensorMeta& meta);
  void SetOp(uint64_t actor_id, std::string op, const ops::AttrMap& attrs = {});

  // The plan with its memory estimate filled in.
  proto::Plan Build() const;
  // The plan so far.
  const proto::Plan& plan() const { return plan_; }

 private:
  proto::Plan plan_;
  std::map<uint64_t, uint32_t> next_task_;  // stream (StreamOf) -> next task index
  std::map<uint64_t, int> index_;           // actor id -> position in plan_.tasks
};

}  // namespace tessera::comm
