#pragma once
// A small fixed-size pool for intra-op parallelism. The calling thread takes
// part in every ParallelFor, so a pool of n threads starts n - 1 workers.
//
// Thread-safe: several threads may call ParallelFor on one pool; their chunks
// share the workers. ParallelFor must not be called from inside a chunk of the
// same pool (no nesting).

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace tessera {

class ThreadPool {
 public:
  // Starts num_threads - 1 workers; where the system refuses a thread, the
  // pool has the ones it got (num_threads() says how many).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each at least
  // `min_chunk` long (except possibly the last), and returns when all are done.
  // A chunk that throws: the first exception is rethrown to the caller once
  // every chunk has ended.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();

  int num_threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// ParallelFor on `pool`, or inline when pool is null or single-threaded.
void ParallelFor(ThreadPool* pool, int64_t n, int64_t min_chunk,
                 const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tessera
