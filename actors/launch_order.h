#pragma once
// The static coordinator (DESIGN §7): every communicator gets its
// collectives and point-to-point transfers in one order derived from the
// plan alone, the same on each of its members, so no member waits on a peer
// that issued something else.
//
// A collective's act n (piece k = n mod m of iteration i = start + n / m, m
// its pieces per iteration) has the key
//
//   (i, epoch, per-micro-batch, slot, order)
//
// epoch counts the gradient-accumulation boundaries upstream (a gradient
// all-reduce after acc comes after every micro-batch); once-per-iteration
// collectives come before the per-micro-batch ones of their epoch; slot is
// the place of (forward or backward, k) in the one-forward-one-backward
// sequence of the collective's stage (OneFOneBSlot); order is the
// conversion's place in the plan's global order (topological). The keys of
// one collective's acts increase, and the collectives over a communicator
// share a stage, so each communicator gets one sequence on all its members.
// 1F1B is also the order the register quotas let the actors run in (DESIGN
// §7), and the keys are consistent with the data: the collective with the
// least key not yet done can always go once its inputs exist, which they
// can without any collective of a larger key. Hence no deadlock.
//
// Each (device, communicator) is a lane. Collective step i of a routine is
// admitted on its lane when it is the lane's head and the lane's previous
// step has been issued; the first step when the actor launches, a later one
// when the previous step completed (BoxingRoutine's StepGate). Step i >= 1
// of a multi-step n-D routine has a communicator of its own ("<group>#i"),
// shared only with other routines' step i over the same ranks, so a routine
// waiting for its first step's peers holds up no single-step collective.
// Conversions that communicate nothing use no lane.
//
// Transfers (Send / Recv, TransferDesc.launch and .order) get keys the same
// way, with `stage` the task's own stage. Every transfer from global rank a
// to rank b goes over the pair's one communicator "p2p/a->b", whose k-th Send
// pairs with its k-th Recv (comm/collective/communicator.h); a's sends and
// b's receives are each a lane (a transfer admitted on it counts as issued
// once Send or Recv returned). Both lanes get one sequence although the two
// sides sit on different stages, and the slot is the only part of the key
// that depends on the stage:
// - iteration, epoch, per-micro-batch and order are the value's own;
// - the stages of a and b differ, and one direction carries only forward
//   values (activations and weights read by a later stage) or only backward
//   values (gradients, to an earlier stage); Build refuses a lane whose
//   per-micro-batch transfers of one epoch mix both;
// - among forwards alone (or backwards alone) the slot grows with the
//   micro-batch on every stage, so the per-micro-batch transfers of an
//   epoch are in (micro-batch, order) sequence on both sides, and the
//   iteration-rate ones (slot 0) precede them, by order.
// In gpt2_nano over p stages the tied token embedding lives on stage 0 and
// the head on stage p-1 reads it: stage 0's repeat hands it out per
// micro-batch, so it crosses 0 -> p-1 per micro-batch as a forward value, in
// (micro-batch, order) sequence with the activations; the head's gradient of
// it crosses back p-1 -> 0 per micro-batch as a backward value and is added
// to the embedding's on stage 0 before the accumulation. Had the weight
// crossed once per iteration it would lead its epoch on 0 -> p-1 (it exists
// from the iteration's start), and a gradient accumulated on p-1 would cross
// in epoch 1, after every activation gradient. The learning rate crosses once
// per iteration in epoch 0, the clipping's norms and factors in epoch 1.
// Neither direction mixes.
// No deadlock: a lane's head waits only for its data (a send for its input
// register, a recv for a free register of its desc), and that never needs a
// transfer behind it on the same lane. The value of micro-batch k is made
// from values of micro-batches <= k of its iteration and epoch, from
// iteration-rate values before them, and from earlier epochs and
// iterations, all ahead of it on any lane they share; a value of the same
// micro-batch it is made from was produced by an earlier node, so it has a
// lower (topological) order. A recv's registers (quota >= 2) come back once
// their consumers read them, which needs only micro-batches before k and
// the backward of values kept for it, whose quota fits 1F1B (DESIGN §7).
//
// Thread-safe: actors may run on any thread.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"

namespace tessera::actors {

// The place of (forward or backward, micro-batch k) in the 1F1B sequence of
// stage s of p with m micro-batches: min(p - s - 1, m) warm-up forwards, then
// forward and backward alternating, then the remaining backwards.
int64_t OneFOneBSlot(int64_t stage, int64_t num_stages, int64_t num_micro_batches, bool backward, int64_t k);

// (iteration, epoch, per-micro-batch, slot, order).
using LaunchKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;

// The key of act `act` of `task` in `plan`: a collective (from its
// BoxingDesc) or a send or recv (from its TransferDesc).
LaunchKey LaunchKeyOf(const proto::Plan& plan, const proto::Task& task, int64_t act);

class CollectiveCoordinator {
 public:
  // Orders the plan's collectives, sends and receives. Errors: a launch
  // order that does not fit the plan (stage outside [0, num_stages),
  // negative epoch); transfers over one pair communicator whose order would
  // differ between its two sides (see above).
  static absl::StatusOr<std::unique_ptr<CollectiveCoordinator>> Build(const proto::Plan& plan);

  // Task `actor_id` (a collective, send or recv) issues its collective step
  // i on the communicator named lanes[i] (names distinct per device; a
  // transfer has one step, on its pair's group); call once per task before
  // the run starts. Tasks that never call it go whenever ready.
  absl::Status Use(uint64_t actor_id, const std::vector<std::string>& lanes);
  // Whether `actor_id` may issue step `step` of its act `act` now: it heads
  // that step's lane and the lane is not issuing. On true the lane waits for
  // Issued.
  bool TryLaunch(uint64_t actor_id, int64_t act, int step = 0);
  // `actor_id` has issued step `step`; returns the lane's new head (to
  // wake), unless it is `actor_id` itself.
  std::vector<uint64_t> Issued(uint64_t actor_id, int step = 0);
  // "cpu:1 <lane>: 'boxing:x:3@1' act 2 next" for every lane with work left.
  std::string Describe() const;
  // Describe() of the lanes `actor_id` waits on: "" when it heads each lane
  // it has work left on (or uses none).
  std::string DescribeWait(uint64_t actor_id) const;

 private:
  struct Entry {
    LaunchKey key;
    uint64_t actor_id = 0;
    bool operator>(const Entry& other) const { return key > other.key; }
  };
  struct Lane {
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heads;  // each collective's next act
    bool issuing = false;  // an admitted launch has not issued all its collectives yet
  };
  // A collective, send or recv task.
  struct Launcher {
    const proto::Task* task = nullptr;
    int64_t acts = 0;
    std::vector<Lane*> lanes;       // per collective step
    std::vector<int64_t> next_act;  // per collective step
  };

  std::string DescribeHead(const std::string& name, const Lane& lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const proto::Plan* plan_ = nullptr;
  mutable std::mutex mu_;
  std::map<std::string, Lane> lanes_ ABSL_GUARDED_BY(mu_);  // "cpu:0 <communicator>"
  std::map<uint64_t, Launcher> launchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::actors
