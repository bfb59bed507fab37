#pragma once
// The lowering of one graph to a physical plan (scheduler/lower.h says what
// the plan holds): tasks per rank of each node's stage, boxing and transfers
// between layouts, in node order (a topological order). Internal to
// scheduler/; LowerToPlan is the entry point.
//
// Run() walks the nodes and hands each to the step for its kind; a step makes
// the node's tasks on every rank of its stage and records where its outputs
// live (shards_). A step that reads a value in a layout nobody produced yet
// asks Ensure(), which runs the boxing step (same stage) or the transfer step
// (across stages) once per (value, stage, layout); later readers share it.
// Each step is defined in its own file under scheduler/lowering/, named after
// it. Single-threaded; borrows everything passed to the constructor, which
// must outlive Run().

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/proto/pipeline_schedule.h"
#include "comm/proto/plan.pb.h"
#include "comm/proto/plan_codec.h"
#include "core/sbp.h"
#include "core/status.h"
#include "core/text.h"
#include "graph/graph.h"
#include "ops/registry.h"
#include "scheduler/lower.h"
#include "scheduler/lowering/graph_facts.h"
#include "scheduler/mesh.h"
#include "scheduler/sbp_infer.h"

namespace tessera::scheduler::lowering {

// Boxing and pipeline transfers run on their own thread per device, so a
// compute stream never waits on a collective.
inline constexpr uint32_t kTransferStream = 1;
// On GPUs, the feeds' and fetches' host work (a Source's fill callback and
// its copy up through a pinned buffer, a Sink's copy down and its callback)
// runs on a thread of its own per device: the copies go on that thread's
// CUDA stream, and the compute thread only launches kernels. (On CPUs,
// which copy nothing, they stay on the compute thread.)
inline constexpr uint32_t kCopyStream = 2;

// One rank's piece of a value in some layout: tensor `tensor` of the
// registers of desc `desc` (produced by a task on that rank's device).
struct Shard {
  int64_t desc = -1;
  int32_t tensor = 0;
};

class Lowering {
 public:
  // `locations`: where each global rank runs (RankLocations in lower.cc).
  Lowering(const graph::Graph& graph, const LowerOptions& options, const DeviceMesh& mesh, const SbpAssignment& sbp,
           const GraphFacts& facts, std::vector<proto::RankLocation> locations)
      : graph_(graph),
        options_(options),
        rates_(facts.rates),
        mesh_(mesh),
        sbp_(sbp),
        facts_(facts),
        locations_(std::move(locations)),
        builder_(options.iterations) {
    builder_.set_device_type(options.parallel.device_type);
  }

  // Lowers every node, then the sink. Call once.
  absl::StatusOr<LoweredPlan> Run();

 private:
  using Node = graph::Node;
  using ValueId = graph::ValueId;

  struct LayoutKey {
    ValueId value;
    int64_t stage;
    std::string sbp;
    auto operator<=>(const LayoutKey&) const = default;
  };

  // ---- The steps (one file each) --------------------------------------------

  // inputs.cc: a graph input that something reads -> one Source per rank,
  // filled by callback "input:<name>[@<device>]" with the rank's slice; one
  // desc (quota source_quota) holding it.
  absl::Status LowerInput(const Node& node);
  // variables.cc: a variable that something reads (not optimizer state) ->
  // one Parameter per rank (callback "init:<name>[@<device>]", the init rule
  // on its shard); one desc of quota 1.
  absl::Status LowerVariable(const Node& node);
  // variables.cc: the optimizer update of variable `owner` runs inside the
  // owner's Parameter tasks: their op, the state tensors (with init rules)
  // and the reads of the gradient and the learning rate. No task of its own.
  absl::Status LowerUpdate(const Node& update, ValueId owner);
  // constants.cc: an op without inputs -> one Parameter without update per
  // rank (the op as its init rule), one desc of quota 1 with every output;
  // read once per micro-batch, plus one Repeat per output with a desc each.
  absl::Status LowerConstant(const Node& node);
  // compute.cc: any other op -> one Compute per rank, one desc holding all
  // its outputs (local shapes, split tensors' refs with their slice).
  absl::Status LowerCompute(const Node& node);
  // accumulation.cc: repeat / acc -> one Repeat / Acc per rank, one desc.
  absl::Status LowerAccumulation(const Node& node);
  // boxing.cc: `v` converted to `sbp` on its own stage -> one Collective per
  // rank on the transfer stream (comm/collective/boxing.h), one desc each.
  absl::Status LowerBoxing(ValueId v, int64_t stage, const NdSbp& sbp);
  // transfers.cc: `v` moved to another stage in `sbp` (boxed on the
  // producer's stage first) -> one Send / Recv pair per parallel id, one
  // desc (quota >= 2) per Recv.
  absl::Status LowerTransfer(ValueId v, int64_t stage, const NdSbp& sbp);
  // sink.cc: one Sink (callback "fetch") on the first rank of the last stage
  // reading the losses and fetches as all-B; fills out_.sink_names.
  absl::Status LowerSink();

  // ---- Shared by the steps (lowering.cc) -------------------------------------

  // The step for `node`'s kind.
  absl::Status LowerNode(const Node& node);
  // Makes `v` available in layout (stage, sbp) on every rank of the stage.
  absl::Status Ensure(ValueId v, int64_t stage, const NdSbp& sbp);
  // The shard of v in (stage, sbp) on parallel id i, read by `consumer`.
  absl::StatusOr<Shard> Read(ValueId v, int64_t stage, const NdSbp& sbp, int64_t i, uint64_t consumer);
  // An op input / output ref with its slice (split values) and, for random
  // ops under micro-batching, the micro-batch stride along the value's batch
  // axis: the iteration's tensor is the micro-batches side by side on that
  // axis (DESIGN §4), so the draws do not depend on how many there are.
  absl::Status SetRef(proto::TensorRef* ref, ValueId v, const TensorSlice& slice, bool draws);
  // The global order of conversions (see lowering.cc).
  void OrderConversions(proto::Plan& plan) const;

  const Placement& placement(int64_t stage) const { return mesh_.stage_placement(stage); }
  // Global rank of parallel id `parallel_id` of `stage`, and where it runs.
  int64_t Rank(int64_t stage, int64_t parallel_id) const { return placement(stage).rank(parallel_id); }
  const proto::RankLocation& Device(int64_t stage, int64_t parallel_id) const {
    return locations_[static_cast<size_t>(Rank(stage, parallel_id))];
  }
  // The stream of Sources and Sinks (kCopyStream).
  uint32_t HostStream() const {
    return options_.feeds_on_copy_stream || options_.parallel.device_type == DeviceType::kCuda ? kCopyStream
                                                                                               : kComputeStream;
  }
  // Local slice of value v on parallel id `i` of `stage` in layout `sbp`.
  absl::StatusOr<TensorSlice> SliceOf(ValueId v, const NdSbp& sbp, int64_t i) const {
    return LocalSlice(graph_.value(v).meta.shape, sbp, mesh_.hierarchy(), i);
  }
  absl::StatusOr<TensorMeta> LocalMeta(ValueId v, const NdSbp& sbp, int64_t i) const {
    ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(v, sbp, i));
    return TensorMeta{graph_.value(v).meta.dtype, slice.local};
  }
  std::string Suffix(int64_t stage, int64_t i) const {
    return mesh_.world_size() == 1 ? std::string() : StrCat("@", options_.device_index + Rank(stage, i));
  }
  bool MicroRate(ValueId v) const { return rates_.value[static_cast<size_t>(v)] == Rate::kMicroBatch; }
  // Whether `node` runs once per micro-batch (its outputs do).
  bool MicroRate(const Node& node) const { return !node.outputs.empty() && MicroRate(node.outputs[0]); }
  void SetRate(uint64_t task, bool micro) {
    if (!micro || rates_.num_micro_batches == 1) return;
    builder_.task(task).set_pieces_per_iteration(rates_.num_micro_batches);
    builder_.task(task).set_acts_per_step(rates_.num_micro_batches);
  }
  // Gradient accumulation's micro-batch window (RegisterDesc.window): on
  // each device of stage s that both feeds micro-batches (Sources) and sums
  // their gradients (Accs), w = stages - s (the micro-batches 1F1B lets the
  // stage run ahead); each Acc gets a control desc to the device's Sources,
  // so micro-batch k + w starts after k's gradients are summed. Nothing when
  // w >= m.
  void GateMicroBatches();
  // A plan on GPUs: every op has a kernel there (its collectives and
  // transfers run on NCCL communicators in the runtime).
  absl::Status CheckDeviceType() const;
  // (stage, parallel id) -> the micro-rate Sources / Accs lowered there.
  std::map<std::pair<int64_t, int64_t>, std::vector<uint64_t>> window_sources_, window_accs_;
  // Records where the outputs of a node's task on parallel id i live.
  void Produced(const Node& node, int64_t stage, int64_t i, int64_t desc);
  // DESIGN §7: a per-micro-batch value that backward reads on stage s is
  // kept for stages - s micro-batches, so stage s can run that many forwards
  // ahead of its backwards and no further: 1F1B emerges from back-pressure.
  int32_t Quota(const std::vector<ValueId>& values, int64_t stage, int32_t base) const;
  // A task on (device, stream) of this node; its id must fit (the builder's
  // errors are sticky, so the first one is returned here).
  absl::StatusOr<uint64_t> NewTask(proto::ActorKind kind, std::string name, uint32_t stream,
                                   const proto::RankLocation& device);
  // A desc on one rank holding `tensors`, produced by `task`.
  absl::StatusOr<int64_t> NewDesc(uint64_t task, int32_t quota, const std::vector<TensorMeta>& tensors);
  // A new conversion (boxing or transfer) of `v`; returns its creation index.
  int64_t NewConversion(ValueId v) {
    conversion_producer_.push_back(graph_.value(v).producer);
    return static_cast<int64_t>(conversion_producer_.size()) - 1;
  }

  const graph::Graph& graph_;
  const LowerOptions& options_;
  const Rates& rates_;  // facts_.rates
  const DeviceMesh& mesh_;
  const SbpAssignment& sbp_;
  const GraphFacts& facts_;
  const std::vector<proto::RankLocation> locations_;  // by global rank
  comm::PlanBuilder builder_;
  LoweredPlan out_;
  std::map<LayoutKey, std::vector<Shard>> shards_;        // per parallel id of the stage
  std::map<ValueId, std::vector<uint64_t>> param_tasks_;  // variable -> Parameter task per parallel id
  // Kept tensors' slices some task already writes to checkpoints ("name@offset/local").
  std::set<std::string> written_slices_;
  // Names `task`'s next kept tensor; it writes the slice unless a task before it does.
  void AddKept(uint64_t task, const std::string& name, const TensorSlice& slice);
  // Per conversion (boxing or transfer), in creation order: the node whose
  // output it converts. Its id names groups and tasks; the plan's order is
  // by producer (see OrderConversions).
  std::vector<graph::NodeId> conversion_producer_;
  // The pipeline schedule of the plan's stages and micro-batches, made by
  // the first transfer that needs it (GPU plans' sender registers).
  std::optional<comm::OneFOneBClock> clock_;
};

// Takes out of `plan` each reshape task whose readers are all computes; they
// read its input register through a view instead (LowerOptions::fold_reshapes,
// fold_reshapes.cc).
absl::Status FoldReshapes(proto::Plan& plan);

}  // namespace tessera::scheduler::lowering
