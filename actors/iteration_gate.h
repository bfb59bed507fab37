#pragma once
// Stopping a run early at an iteration boundary, with every actor agreeing
// where (Ctrl-C and a graceful cancel save a checkpoint there).
//
// The actors that start iterations on their own (Source, Parameter, the
// receiving side of a Transfer) ask the gate before their first piece of
// each iteration. A limit L makes the run end as a plan of L iterations
// would: every iteration below L is completed by every actor, none starts
// one at or past it, so Sinks, finalizers and collectives stay consistent.
// An open gate admits everything.
//
// One process: Close() sets L to one past the highest iteration any actor
// has started.
//
// Several nodes (each with its own gate over the same plan): no node may
// start an iteration the others will not run. Pause() freezes the gate (an
// actor asking for an iteration past the highest one started waits in
// Admit) and returns that highest iteration; the nodes exchange their
// answers (cluster/engine_job.cc, through the master's KV) and each calls
// SetLimit(max over the nodes + 1), which wakes the waiting actors: those
// below the limit go on, the others stop. Pausing needs no actor's
// progress and the answers are final once given, so the exchange cannot
// wait on the run. Release() (an abort) wakes every waiting actor with a
// refusal, so a failed exchange never leaves a thread blocked here.
//
// Thread-safe.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>

#include "absl/base/thread_annotations.h"

namespace tessera::actors {

class IterationGate {
 public:
  // Whether iteration `iteration` (counted from the run's first, 0-based)
  // may start; waits while the gate is paused and the iteration is past
  // every one started so far.
  bool Admit(int64_t iteration) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return released_ || limit_ || !paused_ || iteration <= admitted_; });
    if (released_ || (limit_ && iteration >= *limit_)) return false;
    if (iteration > admitted_) admitted_ = iteration;
    return true;
  }
  // Freezes the gate: no iteration past the highest started so far begins
  // until SetLimit or Release. Returns that iteration (-1: none began).
  int64_t Pause() {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = true;
    return admitted_;
  }
  // Fixes the limit (the first call wins; it should exceed what Pause
  // returned) and wakes the waiting actors. Returns the limit in force.
  int64_t SetLimit(int64_t limit) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!limit_) limit_ = limit;
    cv_.notify_all();
    return *limit_;
  }
  // Pause and SetLimit(started + 1): the run completes the iterations
  // started so far and no more. Returns that number.
  int64_t Close() { return SetLimit(Pause() + 1); }
  // Refuses every iteration from now on and wakes the waiting actors (the
  // run is being aborted).
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // The number of iterations a limited gate lets the run complete.
  std::optional<int64_t> limit() const {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t admitted_ ABSL_GUARDED_BY(mu_) = -1;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<int64_t> limit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::actors
