#include "comm/proto/pipeline_schedule.h"

#include <algorithm>
#include <utility>

namespace tessera::comm {

int64_t OneFOneBSlot(int64_t stage, int64_t num_stages, int64_t num_micro_batches, bool backward, int64_t k) {
  const int64_t m = num_micro_batches;
  const int64_t warmup = std::clamp<int64_t>(num_stages - stage - 1, 0, m);
  if (!backward) return k < warmup ? k : warmup + 2 * (k - warmup);
  return k < m - warmup ? warmup + 2 * k + 1 : m + k;
}

OneFOneBClock::OneFOneBClock(int64_t num_stages, int64_t num_micro_batches)
    : m_(num_micro_batches), times_(static_cast<size_t>(num_stages * 2 * num_micro_batches), 0) {
  const int64_t p = num_stages;
  const int64_t m = num_micro_batches;
  auto at = [&](int64_t s, bool backward, int64_t k) -> int64_t& {
    return times_[static_cast<size_t>((s * 2 + (backward ? 1 : 0)) * m + k)];
  };
  // Each stage's sequence, (backward, k) per slot.
  std::vector<std::vector<std::pair<bool, int64_t>>> sequence(static_cast<size_t>(p));
  for (int64_t s = 0; s < p; ++s) {
    auto& seq = sequence[static_cast<size_t>(s)];
    seq.resize(static_cast<size_t>(2 * m));
    for (int64_t k = 0; k < m; ++k) {
      for (bool backward : {false, true}) seq[static_cast<size_t>(OneFOneBSlot(s, p, m, backward, k))] = {backward, k};
    }
  }
  // Advance every stage as far as its dependencies allow, sweeping down
  // (forwards flow there) and up (backwards) until all ran: each sweep
  // makes progress, since the earliest step not yet timed has its
  // dependency timed.
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<int64_t> last(static_cast<size_t>(p), 0);
  int64_t left = 2 * p * m;
  auto advance = [&](int64_t s) {
    auto& seq = sequence[static_cast<size_t>(s)];
    size_t& i = next[static_cast<size_t>(s)];
    for (; i < seq.size(); ++i) {
      const auto [backward, k] = seq[i];
      int64_t ready = 0;
      if (!backward && s > 0) {
        ready = at(s - 1, false, k);
      } else if (backward && s + 1 < p) {
        ready = at(s + 1, true, k);
      }
      if (ready == 0 && ((!backward && s > 0) || (backward && s + 1 < p))) return;  // not yet run
      last[static_cast<size_t>(s)] = at(s, backward, k) = std::max(last[static_cast<size_t>(s)], ready) + 1;
      --left;
    }
  };
  for (int64_t before = -1; left > 0 && left != before;) {
    before = left;
    for (int64_t s = 0; s < p; ++s) advance(s);
    for (int64_t s = p - 1; s >= 0; --s) advance(s);
  }
}

int64_t OneFOneBClock::Time(int64_t stage, bool backward, int64_t k) const {
  return times_[static_cast<size_t>((stage * 2 + (backward ? 1 : 0)) * m_ + k)];
}

int32_t SenderRegisters(const OneFOneBClock& clock, int64_t from, int64_t to, bool backward, bool strict) {
  const int64_t m = clock.num_micro_batches();
  for (int64_t n = 1; n < m; ++n) {
    bool fits = true;
    for (int64_t k = 0; k + n < m && fits; ++k) {
      const int64_t sent = clock.Time(to, backward, k), next = clock.Time(from, backward, k + n);
      fits = strict ? sent < next : sent <= next;
    }
    if (fits) return static_cast<int32_t>(n);
  }
  return static_cast<int32_t>(std::max<int64_t>(m, 1));
}

}  // namespace tessera::comm
