#pragma once
// Shared-memory communicators for CPU devices of one process (DESIGN.md §9):
// a ShmHub (one per process or job) hands out one Communicator per
// (group, rank); the ranks of a group are usually driven from different
// threads (one per device).
//
// How an op runs: each rank's k-th collective waits in slot k of its group
// until all ranks have issued theirs; the last one to arrive checks that the
// calls match, then executes the op on its own thread (big reductions split
// over the hub's optional thread pool) and calls every rank's `done`. Nobody
// spins: a rank whose peers are late just has a pending slot. Send/Recv pair up
// the same way per (sender, receiver) queue; the second of the pair copies.
//
// Numerics: reductions of f32, f16 and bf16 accumulate in f32 (16-bit inputs
// widened, summed, rounded once); i32 and i64 in their own type (wrapping on
// overflow). Ranks are always combined in order 0, 1, ..., p-1, so every rank
// gets bit-identical results and a run is bit-reproducible, with or without
// the pool. Max propagates NaN. Gathers, all-to-all, broadcast and send/recv
// are byte copies of any dtype.
//
// Lifetime: a group lives while any of its communicators does. Destroying a
// rank's communicator makes the rank leave: ops it already issued still
// complete, but every op of another rank that needs a call the departed rank
// never made fails at once (it would otherwise hang). The hub only indexes
// live groups; it may be destroyed before the communicators it handed out.
//
// Thread-safety: ShmHub and the communicators are thread-safe. Callbacks run
// with no lock held, so they may issue further ops. Do not issue ops from
// inside a chunk of the hub's thread pool (ThreadPool does not nest).

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "comm/collective/communicator.h"
#include "core/thread_pool.h"

namespace tessera::comm {

namespace internal {
class ShmGroup;
}  // namespace internal

class ShmHub {
 public:
  struct Options {
    // Borrowed; must outlive every communicator of the hub. Null: every op runs
    // on the thread of its last arriving rank.
    ThreadPool* pool = nullptr;
    // Reductions with fewer output elements than this stay on one thread.
    int64_t min_parallel_elements = int64_t{1} << 16;
  };

  ShmHub() : ShmHub(Options{}) {}
  explicit ShmHub(Options options) : options_(options) {}
  ShmHub(const ShmHub&) = delete;
  ShmHub& operator=(const ShmHub&) = delete;

  // Returns rank `rank`'s communicator in the group named `group_key`,
  // creating the group (of `group_size` ranks) on its first Join. Errors: a
  // size < 1, a rank outside [0, group_size), a size that differs from the
  // live group's, or a rank that already joined the live group.
  absl::StatusOr<std::shared_ptr<Communicator>> Join(std::string group_key, int group_size,
                                                     int rank);

 private:
  const Options options_;
  std::mutex mu_;
  // Groups die with their last communicator; expired entries are replaced.
  std::map<std::string, std::weak_ptr<internal::ShmGroup>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::comm
