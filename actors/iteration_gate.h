#pragma once
// Stopping a run early at an iteration boundary, with every actor agreeing
// where (Ctrl-C saves a checkpoint: `tessera train`).
//
// The actors that start iterations on their own (Source, Parameter, the
// receiving side of a Transfer) ask the gate before their first piece of
// each iteration. Close() fixes the limit at one past the highest iteration
// any of them has started, so every iteration some actor began is completed
// by all of them, and none starts a later one: the run ends as a plan of
// `limit` iterations would, its Sinks, finalizers and collectives all
// consistent. An open gate admits everything.
//
// One gate serves one runtime (one process). Actors on other nodes cannot
// see it: a gate is for plans without peer nodes (Runtime refuses it
// otherwise). Thread-safe.

#include <cstdint>
#include <mutex>
#include <optional>

#include "absl/base/thread_annotations.h"

namespace tessera::actors {

class IterationGate {
 public:
  // Whether iteration `iteration` (counted from the run's first, 0-based)
  // may start.
  bool Admit(int64_t iteration) {
    std::lock_guard<std::mutex> lock(mu_);
    if (limit_ && iteration >= *limit_) return false;
    if (iteration > admitted_) admitted_ = iteration;
    return true;
  }
  // Closes the gate: the run completes the iterations started so far and
  // no more. Returns that number (the first call fixes it).
  int64_t Close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!limit_) limit_ = admitted_ + 1;
    return *limit_;
  }
  // The number of iterations a closed gate lets the run complete.
  std::optional<int64_t> limit() const {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }

 private:
  mutable std::mutex mu_;
  int64_t admitted_ ABSL_GUARDED_BY(mu_) = -1;
  std::optional<int64_t> limit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::actors
