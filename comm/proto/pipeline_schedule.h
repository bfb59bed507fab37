#pragma once
// The one-forward-one-backward pipeline schedule (DESIGN §7) as arithmetic,
// shared by the scheduler (the registers of values sent between stages) and
// the runtime's launch order (actors/launch_order.h), which derive it from
// the plan alone.

#include <cstdint>
#include <vector>

namespace tessera::comm {

// The place of (forward or backward, micro-batch k) in the 1F1B sequence of
// stage s of p with m micro-batches: min(p - s - 1, m) warm-up forwards, then
// forward and backward alternating, then the remaining backwards.
int64_t OneFOneBSlot(int64_t stage, int64_t num_stages, int64_t num_micro_batches, bool backward, int64_t k);

// The global 1F1B schedule of p stages and m micro-batches: every stage runs
// its OneFOneBSlot sequence as early as the data allows, each forward and
// backward taking one step; stage s's forward of k follows stage s-1's, its
// backward of k follows stage s+1's (the last stage's, its own forward).
class OneFOneBClock {
 public:
  OneFOneBClock(int64_t num_stages, int64_t num_micro_batches);
  // The step (>= 1) at whose end stage `stage` has run (backward, k).
  int64_t Time(int64_t stage, bool backward, int64_t k) const;
  int64_t num_micro_batches() const { return m_; }

 private:
  int64_t m_;
  std::vector<int64_t> times_;  // [stage][backward][k]
};

// A value made per micro-batch on stage `from` (in its forward or backward)
// and sent to stage `to`, which reads it in the same direction. When each
// transfer is launched at the reader's step (launch order keys, one lane
// per device), the sender's register of micro-batch k stays taken until
// that step: the registers the sender needs so that writing micro-batch
// k + n comes after sending k, for every k (at least 1). `strict`: the
// writer is itself a launch of the lane (a collective), which must come
// after the send, not at the same step.
int32_t SenderRegisters(const OneFOneBClock& clock, int64_t from, int64_t to, bool backward, bool strict);

}  // namespace tessera::comm
