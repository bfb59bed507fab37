#pragma once
// Lowering a logical graph (after Autodiff / AccumulateGradients /
// ApplyOptimizer / EliminateDeadCode) to a physical plan (DESIGN §7) on the
// devices of `options.parallel` (scheduler/mesh.h: pipeline stages, each a
// [data, tensor] mesh; one CPU device by default).
//
// SBP inference (scheduler/sbp_infer.h) gives every value its stage and
// nd-SBP and every op its signature; then, for each node, one task per rank
// of its stage (on the rank's node and device: options.devices_per_node,
// Plan.ranks):
//   - a Source per graph input that something reads, filled per rank by
//     callback "input:<name>[@<device>]" with the rank's shard (its
//     proto::SourceDesc says which input and which slice of it);
//   - a Parameter per variable shard, initialised by its init rules
//     (proto::InitRule: the variable's init op and its state's, on the
//     shard), or by host callback "init:<name>[@<device>]" where the host
//     registers one (a run that goes on from trained values);
//     the optimizer update of the variable (an op whose output 0 is its
//     update and whose other outputs update state variables it reads) runs
//     inside that task, on the shards, the state variables becoming the
//     task's state tensors;
//   - a Compute per remaining op node, producing one register desc that holds
//     all its outputs (local shapes; split tensors' refs carry their slice of
//     the logical tensor);
//   - a Parameter without update per constant op (no inputs), filled once by
//     its init rule (the op itself, on the shard);
//   - Repeat / Acc tasks for gradient accumulation's repeat / acc nodes;
//   - where a consumer needs a value in another layout: one Collective task
//     per rank of the stage (boxing, comm/collective/boxing.h), and between
//     stages one Send / Recv pair per rank (after boxing on the producer's
//     stage); conversions are shared by the consumers that need the same
//     layout, and run on stream 1 of each device;
//   - one Sink (callback "fetch") on the first rank of the last stage,
//     reading the losses and fetches as (B, B).
// The "[@<device>]" suffix appears only with more than one device.
//
// Gradient accumulation (m micro-batches, from the repeat / acc nodes): every
// value runs once per iteration (variables, the learning rate, what follows
// an acc) or once per micro-batch (data inputs and what lies between repeat
// and acc); per-micro-batch tasks get pieces_per_iteration = m, and random
// ops (dropout) get the micro-batch's offset in the iteration's tensor along
// the value's batch axis (TensorRef.micro_batch_stride / micro_batch_axis;
// the axis follows the ops' SBP signatures from the data inputs' axis 0, so
// a transposed activation moves along axis 1), so their masks do not depend
// on m. A random op on a value whose axis no signature gives is an error.
// Losses and fetches must be iteration values (AccumulateGradients averages
// them).
//
// Quotas (DESIGN §7): default_quota, sources source_quota, cross-stage
// buffers at least 2, and a per-micro-batch value that backward nodes
// (graph::Node::backward) read on stage s at least stages - s, so 1F1B emerges.
// Conversions over the same ranks share one communicator, and every
// collective carries its launch order (the runtime's coordinator issues them
// in it, actors/launch_order.h). Not done: placement hints.
//
// Implementation: scheduler/lowering/ (lowering.h; one file per step).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"
#include "core/sbp.h"
#include "graph/graph.h"
#include "scheduler/mesh.h"
#include "scheduler/sbp_infer.h"

namespace tessera::scheduler {

inline constexpr uint32_t kComputeStream = 0;
inline constexpr char kSinkCallback[] = "fetch";

struct LowerOptions {
  int64_t iterations = 1;
  int64_t start_iteration = 0;  // Plan.start_iteration (a run continuing an earlier one)
  int32_t default_quota = 1;
  int32_t source_quota = 2;
  uint32_t device_index = 0;  // device of rank 0 (one node only)
  // Devices of each node, in node order; global ranks fill node 0 first
  // (DESIGN §4). Their sum must be the mesh's world size. Empty = one node.
  std::vector<uint32_t> devices_per_node = {};
  ParallelConfig parallel = {};
  int zero_stage = 0;  // SbpInferOptions::zero_stage
  // Every task that runs kernels (computes and parameters with an op, accs)
  // acts asynchronously (Task.async_acts): each act enqueues its kernel on
  // its device's stream and hands its registers on when it completed (a CUDA
  // stream on GPUs; on CPUs a worker thread per device stream).
  // (parallel.device_type is the devices' type:
  // every task of the plan is on a device of it. CUDA plans act
  // asynchronously, as with async_compute, and every compute's op must have
  // a CUDA kernel, else an error naming it.)
  bool async_compute = false;
  // Sources and Sinks on a thread of their own per device (the copy stream,
  // lowering.h kCopyStream), as CUDA plans always have them; CPU plans keep
  // them on the compute thread unless this is set (the stress test runs the
  // copy stream's messages across threads on CPUs this way).
  bool feeds_on_copy_stream = false;
  // Reshapes cost no copy: a reshape task whose readers are all computes
  // is taken out of the plan, and its readers read its input register
  // through a view of the reshaped local shape (TensorRef.view_shape); that
  // register then keeps as many registers as either had (FoldReshapes in
  // scheduler/lowering/fold_reshapes.cc). Off: every reshape copies (tests
  // compare the two).
  bool fold_reshapes = true;
};

struct LoweredPlan {
  proto::Plan plan;  // with its memory estimate
  // Names of the tensors the sink callback receives, in order: "loss" (or
  // "loss<i>" for i > 0) and the fetch names; "" for tensors of the consumed
  // registers that are neither.
  std::vector<std::string> sink_names;
  // The SBP assignment in words (SbpAssignment::ToText), for `tessera plan`.
  std::string sbp_text;
};

absl::StatusOr<LoweredPlan> LowerToPlan(const graph::Graph& graph, const LowerOptions& options = {});

// What LowerToPlan refuses in `options` before it reads a graph (and
// without iterations): the quotas, the ZeRO stage, the mesh, its devices'
// placement, and `graph`'s layer indices against the pipeline's layers.
// Engine::Compile runs it, so a bad option fails there, not at each Run.
absl::Status CheckLowerOptions(const graph::Graph& graph, const LowerOptions& options);

}  // namespace tessera::scheduler
