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
#include "comm/proto/actor_id.h"
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
// The whole tensor is written as an empty slice.
proto::TensorSlice ToProto(const TensorSlice& slice);
proto::TensorDesc ToProto(const TensorMeta& meta, std::string name = {});

// Registers a task produces per iteration: pieces_per_iteration, 0 read as 1.
inline int64_t PiecesPerIteration(const proto::Task& task) {
  return task.pieces_per_iteration() > 1 ? task.pieces_per_iteration() : 1;
}

// Limits a plan is held to (ValidatePlan, PlanBuilder; plans arrive from
// the network), each far above what a real plan uses:
//   - its wire size: protobuf's own limit;
//   - register_num, the quota: a few registers in any real plan (pipeline
//     stages need at most their count); it bounds what loading allocates;
//   - iterations and start_iteration: each at most 2^62, so their sum and
//     the act counts derived from them fit in int64;
//   - per task, at most kMaxTaskArity consumed descs, produced descs, op
//     inputs, op outputs and state tensors (the runtime resolves refs
//     against descs pairwise);
//   - a boxing hierarchy of at most kMaxHierarchyAxes axes (the boxing
//     planner searches 3^axes layouts).
inline constexpr int64_t kMaxPlanBytes = int64_t{2147483647};
inline constexpr int32_t kMaxRegisterNum = 1024;
inline constexpr int64_t kMaxIterations = int64_t{1} << 62;
inline constexpr int kMaxTaskArity = 4096;
inline constexpr int kMaxHierarchyAxes = 4;

// An error when the plan's wire form would exceed kMaxPlanBytes.
absl::Status CheckPlanSize(const proto::Plan& plan);
// The plan's wire form, deterministic (attributes in key order: one plan
// always gives the same bytes). The plan must pass CheckPlanSize (plans
// from PlanBuilder::Build do; CHECKed).
std::string SerializePlan(const proto::Plan& plan);
absl::StatusOr<proto::Plan> ParsePlan(std::string_view bytes);

// One NodePlan per node of the plan (DESIGN §9), in node order (nodes
// 0 .. n-1 from Plan.ranks; node 0 alone without them): each holds its
// node's tasks, the register descs they produce, the memory estimate of its
// devices, the plan's iterations, start iteration, mesh and ranks, the other
// nodes it shares communicators with and its communicator groups that span
// nodes. Errors: a task on a node that has no rank, a register desc read on
// another node than its producer's.
absl::StatusOr<std::vector<proto::NodePlan>> SplitPlan(const proto::Plan& plan);
std::string SerializeNodePlan(const proto::NodePlan& node_plan);
absl::StatusOr<proto::NodePlan> ParseNodePlan(std::string_view bytes);

// What each (node, device) holds (proto::DeviceMemory): its Parameter
// tasks' variables and state, its arena (Plan.arenas), the registers outside
// it, and what the arena's registers would take unshared (gradients,
// activations). Errors: a sum that overflows, a state tensor that is not
// a valid tensor.
absl::StatusOr<std::vector<proto::DeviceMemory>> EstimateMemory(const proto::Plan& plan);

// Builds plans task by task (the scheduler; tests and benchmarks by hand).
// Ids are assigned in call order. Structural mistakes show in ValidatePlan,
// not here; what comes from the size of the job is checked here: an actor
// id that does not fit its bits (device index > 255, stream > 4095, more
// than 2^24 tasks on a stream), a register_num outside [1, kMaxRegisterNum],
// a byte count or memory sum that does not fit. Such errors are STICKY, as
// GraphBuilder's: the first is kept in status(), and the failing call adds
// nothing (AddTask returns kNoActorId, AddRegisterDesc -1, AddState -1). Check
// status() after Build(), or after each call whose result you use. Passing
// an id that was never returned (e.g. after an error) is a bug: CHECKed.
//
// Not thread-safe.
class PlanBuilder {
 public:
  explicit PlanBuilder(int64_t iterations) { plan_.set_iterations(iterations); }

  // The device type of the tasks added from now on (default: CPU).
  void set_device_type(DeviceType type) { device_type_ = type; }
  // Adds a task on (node, <device type>:device_index, stream) with the next
  // task index of that stream; returns its actor id.
  uint64_t AddTask(proto::ActorKind kind, std::string name, uint32_t stream = 0, uint32_t device_index = 0,
                   uint32_t node = 0);
  proto::Task& task(uint64_t actor_id);
  // The plan so far, for rewrites of the whole plan before Build (the
  // lowering's reshape folding); call Reindex after one that moved tasks.
  proto::Plan& mutable_plan() { return plan_; }
  void Reindex() {
    index_.clear();
    for (int i = 0; i < plan_.tasks_size(); ++i) index_[plan_.tasks(i).actor_id()] = i;
  }

  // A register desc produced by `producer`, read by `consumers`, holding
  // `tensors` (dtype, local shape); registers the ids on both sides.
  int64_t AddRegisterDesc(uint64_t producer, const std::vector<uint64_t>& consumers, int32_t register_num,
                          const std::vector<TensorMeta>& tensors);

  // Adds `consumer` as a reader of desc `desc_id` (once: a second call for
  // the same pair does nothing).
  void AddConsumer(int64_t desc_id, uint64_t consumer);
  // A control desc of the micro-batch window `window` (RegisterDesc.window,
  // no tensors, `window` registers) from Acc `acc` to `sources`.
  int64_t AddWindowDesc(uint64_t acc, const std::vector<uint64_t>& sources, int32_t window);

  // Appends an op input / output referring to tensor `tensor_index` of desc.
  void AddInput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index = 0);
  void AddOutput(uint64_t actor_id, int64_t desc_id, int32_t tensor_index = 0);
  // Parameter actors: an input / output referring to state tensor `state_index`.
  void AddStateInput(uint64_t actor_id, int32_t state_index);
  void AddStateOutput(uint64_t actor_id, int32_t state_index);
  // Parameter actors: adds an optimizer state tensor; returns its index.
  int32_t AddState(uint64_t actor_id, const TensorMeta& meta);
  void SetOp(uint64_t actor_id, std::string op, const ops::AttrMap& attrs = {});
  // Parameter actors: appends an init rule writing the next slices.size()
  // tensors (the variable's, then the state's) from `op` (proto::InitRule).
  void AddInitRule(uint64_t actor_id, const std::string& op, const ops::AttrMap& attrs,
                   const std::vector<TensorSlice>& slices);
  // Parameter actors: names the next tensor the task keeps (the variable's,
  // then each state's, in order) for checkpoints; `write` as KeptTensor.
  void AddKept(uint64_t actor_id, const std::string& name, bool write);
  // Source actors: the graph input they feed and their shard of it.
  void SetSource(uint64_t actor_id, const std::string& input, const TensorMeta& logical, const TensorSlice& slice);

  // The plan with its arenas planned (comm/proto/memory_plan.h) and its
  // memory estimate filled in (an error there, or a plan over
  // kMaxPlanBytes, goes to status()).
  proto::Plan Build();
  // Why the last Build shared no arena bytes, or why some blocks got bytes
  // of their own though they might have shared ("" when neither; logged as a
  // warning too).
  const std::string& memory_note() const { return memory_note_; }
  // The plan so far.
  const proto::Plan& plan() const { return plan_; }
  // The first error, or OK.
  const absl::Status& status() const { return status_; }

 private:
  void Fail(absl::Status status);

  proto::Plan plan_;
  absl::Status status_;
  std::string memory_note_;
  DeviceType device_type_ = DeviceType::kCpu;
  std::map<uint64_t, uint32_t> next_task_;  // stream (StreamOf) -> next task index
  std::map<uint64_t, int> index_;           // actor id -> position in plan_.tasks
};

}  // namespace tessera::comm
