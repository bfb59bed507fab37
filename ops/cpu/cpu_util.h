#pragma once
// Helpers for CPU kernels: how to cut element loops into chunks for the
// intra-op pool, and thin typed access.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <mutex>

#include "absl/status/status.h"
#include "core/thread_pool.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cpu {

// Below this many elements per chunk, waking another thread costs more than
// it saves (a wake-up is a few microseconds; a chunk this size takes ~10 µs).
inline constexpr int64_t kElementwiseGrain = 1 << 14;

// Runs fn(begin, end) over [0, n) on the context's intra-op threads, chunks
// at least `grain` long.
inline void ParallelFor(const KernelContext& ctx, int64_t n, int64_t grain,
                        const std::function<void(int64_t, int64_t)>& fn) {
  tessera::ParallelFor(ctx.pool, n, grain, fn);
}

// Rows of `row_elements` each: chooses a grain in rows so each chunk holds
// about kElementwiseGrain elements.
inline int64_t RowGrain(int64_t row_elements) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, row_elements));
}

// The first error of the pieces of a ParallelFor (any thread may Note one).
class FirstError {
 public:
  void Note(const absl::Status& status) {
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = status;
  }
  absl::Status Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  absl::Status status_;
};

}  // namespace tessera::ops::cpu
