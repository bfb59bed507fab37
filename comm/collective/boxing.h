#pragma once
// Boxing on one placement (DESIGN.md §7): the physical conversion of a global
// tensor from one nd-SBP to another, as an asynchronous routine over the
// Communicators of one rank. The scheduler puts one boxing actor per rank on
// every edge whose SBP differs between producer and consumer; the actor holds
// the rank's shard under `from`, a preallocated shard under `to`, launches the
// routine and releases its registers from the completion callback.
// Placement changes (pipeline stages) are not boxing's business.
//
// 1-D conversions (p ranks, balanced uneven splits, zero-size shards allowed):
//   P -> B          all-reduce              P(max) -> B     all-reduce max
//   P -> S(i)       reduce-scatter          P(max) -> S(i)  reduce-scatter max
//                   (chunks packed contiguous first when i != 0)
//   S(i) -> B       all-gather (unpacked when i != 0)
//   S(i) -> S(j)    all-to-all (packed by j, unpacked by i)
//   B -> S(i)       local slice
//   B -> P          rank 0 keeps the tensor, the others hold zeros
//   S(i) -> P       local: the full logical shape, zeros outside the shard
//   X -> X          copy
// Reductions of f16/bf16 go through the communicator (f32 accumulation in rank
// order, so every rank gets the same bits).
//
// n-D: the routine is a sequence of 1-D steps, each converting one hierarchy
// axis a while the other axes stay put, run within the rank's axis-a group
// (comms.axis[a]). A step is "axis-local" (a 1-D boxing of the group's common
// block) unless an inner axis b > a splits a tensor axis that the step splits
// or gathers: then the inner split's pieces change with the outer conversion.
//   - Axis by axis: if some order of the per-axis conversions from[a] -> to[a]
//     is all axis-local, the cheapest such order is taken.
//   - General path otherwise: a cheapest sequence of axis-local steps through
//     intermediate nd-SBPs whose axes take values from {from[a], to[a], B}
//     (e.g. (S(0), S(0)) -> (B, S(0)) via (S(0), B), (B, B)). One always
//     exists: gather or reduce to all-B innermost axis first, then slice or
//     keep outermost axis first.
// The route and its cost come from core/boxing_cost.h (ChooseBoxingRoute:
// bytes each rank sends per DESIGN.md §7 on the axis group's block, fewer
// steps winning ties), the model SBP inference chooses layouts by. The plan
// depends only on the spec, so every rank issues the same collectives in the
// same order on each of its groups (the collective-sequence contract).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/collective/communicator.h"
#include "core/sbp.h"
#include "core/tensor.h"

namespace tessera::comm {

struct BoxingSpec {
  TensorMeta logical;              // logical dtype and shape
  NdSbp from, to;                  // one entry per hierarchy axis
  std::vector<int64_t> hierarchy;  // e.g. {4} or {2, 2}

  // "f32(6, 5) (S(1), P) -> (B, B) on [2, 2]"
  std::string ToString() const;
};

// The communicators of one rank. axis[a]: the group of ranks that differ from
// this one only in hierarchy axis a, ordered by that axis' coordinate (so its
// rank() is this rank's coordinate a). Borrowed; they must outlive the launch.
// `all` (the whole placement, row-major rank order) is not used by the current
// paths, which are all made of axis-local steps; it may be null.
struct BoxingComms {
  std::vector<Communicator*> axis;
  Communicator* all = nullptr;
  // When not empty: the communicator of each collective step, in
  // Collectives() order (each of the size and rank of its step's axis),
  // instead of `axis` — so a later step can have a communicator of its own.
  std::vector<Communicator*> steps;
};

// Called before the routine issues collective step `index` >= 1 (in
// Collectives() order), from the thread that completed the previous step;
// the routine issues it when `issue` is called, on any thread, once.
using StepGate = std::function<void(int index, std::function<void()> issue)>;

namespace internal {
struct BoxingPlan;
}  // namespace internal

// One rank's boxing of one edge: validated and planned once by Create, then
// launched once per piece. Immutable after Create; Launch may be called from
// any thread, but the next Launch on the same communicators must wait for the
// previous `done` (the steps of one launch issue their collectives one after
// another, each from the previous one's completion, so two launches in flight
// on the same groups could interleave differently on different ranks) —
// unless a StepGate and per-step communicators keep every step in one order
// on all ranks, as the runtime's coordinator does.
// Copying a routine is cheap (the plan is shared and immutable).
class BoxingRoutine {
 public:
  // Validates the spec (axes and ranks in range, partial kinds, dtype) and
  // plans the rank's steps. `rank_coordinates`: this rank's coordinate on each
  // hierarchy axis. Errors are one line naming the spec, e.g.
  // "boxing f32(6, 5) (P(max)) -> (P) on [4]: P(max) converts only to B, S(i) or P(max)".
  static absl::StatusOr<BoxingRoutine> Create(const BoxingSpec& spec, std::vector<int64_t> rank_coordinates);

  const BoxingSpec& spec() const;
  const std::vector<int64_t>& rank_coordinates() const;
  // This rank's local shapes under `from` and `to`. A partial (P) axis keeps
  // the block of the other axes, so S(i) -> P yields the full group block.
  const Shape& input_shape() const;
  const Shape& output_shape() const;

  // For the plan printout; the same on every rank. 1-D:
  //   "S(1) -> B: all-gather (unpack axis 1)"
  // n-D, one clause per step, naming the path taken:
  //   "(S(0), P) -> (S(0), B) axis by axis: axis 1 P -> B: all-reduce"
  //   "(S(0), S(0)) -> (B, S(0)) via (S(0), B), (B, B): axis 1 S(0) -> B: all-gather; ..."
  std::string Describe() const;
  // The collectives it issues, in order: "all_reduce", "reduce_scatter",
  // "all_gather", "all_to_all". Empty for local conversions.
  std::vector<std::string> Collectives() const;
  // The hierarchy axis (index into BoxingComms::axis) of each of Collectives().
  std::vector<int> CollectiveAxes() const;

  // Converts `input` (input_shape(), the spec's dtype) into `output`
  // (output_shape(), on input's device; so is the scratch). Local steps on a
  // GPU are the CUDA runtime's copies and memsets on the calling thread,
  // waited for; collectives are the communicators' (NCCL's on GPUs).
  // Returns at once; `done` is called exactly once, on any thread (possibly
  // inline), after the last step or at the first failure, with a one-line
  // error naming the spec and the step. The caller keeps `input` unchanged
  // and `output` unread until then. Scratch buffers (packed chunks,
  // intermediate layouts) lie in `scratch` (at least ScratchBytes() bytes,
  // untouched by others until `done`; the actor runtime's come from the
  // memory plan), or are allocated per launch when it is undefined. An
  // argument error (shapes, dtype, devices, missing communicator) is
  // reported inline before any collective is issued, so the peers' matching
  // collectives stay pending: the caller aborts the job
  // (Communicator::Abort), as for any failed actor.
  // `gate`, when set, holds each collective step after the first until it
  // lets it go (a launch order across routines sharing communicators).
  void Launch(const Tensor& input, Tensor output, const BoxingComms& comms, DoneFn done, StepGate gate = nullptr,
              Tensor scratch = {}) const;
  // Bytes of scratch one launch uses (0: none): intermediate layouts of an
  // n-D route, inputs packed into piece order, outputs received flat.
  int64_t ScratchBytes() const;

 private:
  explicit BoxingRoutine(std::shared_ptr<const internal::BoxingPlan> plan) : plan_(std::move(plan)) {}
  std::shared_ptr<const internal::BoxingPlan> plan_;
};

}  // namespace tessera::comm
