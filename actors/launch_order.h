#pragma once
// The static collective coordinator (DESIGN §7): every communicator gets its
// collectives in one order derived from the plan alone, the same on each of
// its members, so no member waits on a peer that issued something else.
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

#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"

namespace tessera::actors {

// The place of (forward or backward, micro-batch k) in the 1F1B sequence of
// stage s of p with m micro-batches: min(p - s - 1, m) warm-up forwards, then
// forward and backward alternating, then the remaining backwards.
int64_t OneFOneBSlot(int64_t stage, int64_t num_stages, int64_t num_micro_batches, bool backward, int64_t k);

// (iteration, epoch, per-micro-batch, slot, order).
using LaunchKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;

// The key of act `act` of collective task `task` in `plan`.
LaunchKey LaunchKeyOf(const proto::Plan& plan, const proto::Task& task, int64_t act);

class CollectiveCoordinator {
 public:
  // Errors: a launch order that does not fit the plan (stage outside
  // [0, num_stages), negative epoch).
  static absl::StatusOr<std::unique_ptr<CollectiveCoordinator>> Build(const proto::Plan& plan);

  // Collective `actor_id` issues its collective step i on the communicator
  // named lanes[i] (names distinct per device); call once per collective
  // before the run starts. Collectives that never call it go whenever ready.
  absl::Status Use(uint64_t actor_id, const std::vector<std::string>& lanes);
  // Whether collective `actor_id` may issue step `step` of its act `act` now:
  // it heads that step's lane and the lane is not issuing. On true the lane
  // waits for Issued.
  bool TryLaunch(uint64_t actor_id, int64_t act, int step = 0);
  // `actor_id` has issued step `step`; returns the lane's new head (to
  // wake), unless it is `actor_id` itself.
  std::vector<uint64_t> Issued(uint64_t actor_id, int step = 0);
  // "cpu:1 <lane>: 'boxing:x:3@1' act 2 next" for every lane with work left.
  std::string Describe() const;

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
  struct Collective {
    const proto::Task* task = nullptr;
    int64_t acts = 0;
    std::vector<Lane*> lanes;       // per collective step
    std::vector<int64_t> next_act;  // per collective step
  };

  const proto::Plan* plan_ = nullptr;
  mutable std::mutex mu_;
  std::map<std::string, Lane> lanes_;  // "cpu:0 <communicator>"
  std::map<uint64_t, Collective> collectives_;
};

}  // namespace tessera::actors
