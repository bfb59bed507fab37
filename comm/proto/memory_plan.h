#pragma once
// The memory planner (DESIGN §7): one arena per device, and an offset in it
// for every register desc whose contents do not outlive an iteration (all but
// a Parameter's variable, which lives across iterations, and a Repeat's
// views, which are slices of another register).
//
// Two descs may share bytes only when the register protocol itself keeps
// their lifetimes apart, in every iteration and whatever order the threads
// run in: the planner unrolls the plan into the acts of a few iterations (a
// start and an end event per act; edges for program order (an asynchronous
// task's, Task.async_acts: its starts in order and its ends), a register handed
// on (ready -> use), a register handed back (release -> the producer's
// reuse of it), a collective's peers meeting in one of its collective steps,
// a send meeting its recv) and
// lets desc A share with desc B only when every consumer's release of A's
// last register of an iteration happens before B's first write of the same
// iteration, and every release of B's happens before A's first write of the
// next one (or the same with A and B swapped). Any event order the threads
// may take respects those edges, so no two registers sharing bytes are ever
// in use at once; an edge the model leaves out only means less sharing.
//
// The act patterns per actor kind mirror actors/kinds/ (each file's act
// condition); where a plan does not fit them (a consumer that reads at
// another rate than its producer writes, say), the planner gives every desc
// bytes of its own and says why in the returned note.
//
// Offsets: greedy by size, each desc at the lowest offset where it overlaps
// no desc it may not share with (as TFLite's and OneFlow's planners do).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"

namespace tessera::comm {

// Alignment of every tensor in an arena (one cache line, one AVX-512 vector).
inline constexpr int64_t kArenaAlignment = 64;

// Bytes one register of `desc` takes in an arena: its tensors one after
// another, each rounded up to kArenaAlignment. Errors: a tensor that is not
// valid, a size that overflows.
absl::StatusOr<int64_t> RegisterStride(const proto::RegisterDesc& desc);

// Whether `desc` (produced by a task of `producer_kind`) belongs in its
// device's arena: bytes of its own, contents that do not outlive an
// iteration.
bool ArenaEligible(const proto::RegisterDesc& desc, proto::ActorKind producer_kind);

struct MemoryPlanResult {
  // Why no bytes are shared ("" when the planner could share): the plan
  // does not fit the protocol model, so every desc got bytes of its own.
  std::string unshared_reason;
  // Why some blocks got bytes of their own though the model describes the
  // plan ("" when none did): the lifetime analysis would have taken too long
  // (registers used many times an iteration, under many accumulation steps).
  std::string partly_unshared_reason;
};

// The most word operations the lifetime analysis takes by default (a few
// seconds). Micro-batches that are copies of one another are walked once,
// and a last use's walk into the next iteration only where an order needs
// it, so the cost hardly grows with the micro-batches of an iteration:
// beyond the budget, the blocks used most often per
// iteration are left out of the analysis (they get bytes of their own) until
// it fits; if even those used once do not fit, nothing is shared.
inline constexpr int64_t kDefaultMaxAnalysisWork = int64_t{1} << 30;

struct PlanMemoryOptions {
  int64_t max_analysis_work = kDefaultMaxAnalysisWork;
};

// Plans every device's arena: sets arena_offset on each eligible desc and
// Plan.arenas (replacing earlier ones). Errors: a malformed desc (see
// RegisterStride), a task or desc the plan names twice.
absl::StatusOr<MemoryPlanResult> PlanMemory(proto::Plan& plan, const PlanMemoryOptions& options = {});

// Checks a planned plan: each desc with an offset is eligible, aligned and
// inside its device's arena, each device has one arena; and any two descs of
// a device whose bytes overlap have lifetimes the protocol keeps apart (as
// the planner decides it; the plan must hold every task of the job, since
// the ordering may go through other nodes). The error names both descs.
absl::Status CheckMemoryPlan(const proto::Plan& plan);

namespace internal {
// For tests: the lifetime order bits the planner works out for every block
// of `plan` (rows of last, wrap, same and step, one after another), found by
// walking from each group of sources only as far as its tests look
// (exhaustive = false, what PlanMemory does) or across every event (the
// reference). Errors: a plan the protocol model does not describe.
absl::StatusOr<std::vector<std::vector<uint64_t>>> LifetimeOrders(const proto::Plan& plan, bool exhaustive);
// For tests: the layers [first, last] of the micro-batches (blocks of
// `uses` uses an iteration) that are copies of one another, whose uses the
// planner walks once (first > last: none).
absl::StatusOr<std::pair<int64_t, int64_t>> PeriodicBand(const proto::Plan& plan, int64_t uses);
}  // namespace internal

// Only the structural part of CheckMemoryPlan (offsets, alignment, bounds):
// what a node checks on its part of a plan, which lacks the other nodes'
// tasks.
absl::Status CheckArenaBounds(const proto::Plan& plan);

}  // namespace tessera::comm
