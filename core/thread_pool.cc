#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <new>

#include "core/logging.h"

namespace tessera {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  try {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  } catch (const std::exception& e) {
    // (A thread the system refuses, EAGAIN: fewer, rather than a pool whose
    // chunks no worker takes, or std::terminate.)
    TLOG_WARN("thread pool: started {} of {} threads ({})", workers_.size() + 1, num_threads_, e.what());
    num_threads_ = static_cast<int>(workers_.size()) + 1;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int64_t chunks = std::min<int64_t>(num_threads_, (n + min_chunk - 1) / min_chunk);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  // Chunk c covers [c*n/chunks, (c+1)*n/chunks); the caller runs chunk 0.
  // Every chunk ends before this returns, one that throws too (its
  // exception kept for the caller): the queued ones read this frame.
  std::mutex done_mu;
  std::condition_variable done_cv;
  int64_t remaining = chunks - 1;
  std::exception_ptr error;  // the first chunk's to throw (under done_mu)
  const auto run = [&](int64_t c) {
    std::exception_ptr thrown;
    try {
      fn(c * n / chunks, (c + 1) * n / chunks);
    } catch (...) {
      thrown = std::current_exception();
    }
    std::lock_guard<std::mutex> done_lock(done_mu);
    if (thrown && !error) error = thrown;
    if (c > 0 && --remaining == 0) done_cv.notify_one();
  };
  int64_t queued = 0;
  try {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t c = 1; c < chunks; ++c) {
      queue_.emplace_back([&run, c] { run(c); });
      ++queued;
    }
  } catch (const std::bad_alloc&) {
    // (No memory to queue the rest: the caller runs them.)
  }
  work_cv_.notify_all();
  run(0);
  for (int64_t c = queued + 1; c < chunks; ++c) run(c);
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return remaining == 0; });
  if (error) std::rethrow_exception(error);
}

void ParallelFor(ThreadPool* pool, int64_t n, int64_t min_chunk,
                 const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr || pool->num_threads() <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  pool->ParallelFor(n, min_chunk, fn);
}

}  // namespace tessera
