// The CPU stream (core/stream.h): a worker thread and an in-order queue.
#include "core/stream.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <variant>

#include "absl/base/thread_annotations.h"

namespace tessera {

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::string name) : name_(std::move(name)), state_(std::make_shared<State>()) {
    // The worker holds the state: a work item that never returns keeps it
    // alive after Shutdown gave up on it and the stream is gone.
    worker_ = std::thread([state = state_] { Loop(*state); });
  }
  ~CpuStream() override { Shutdown(/*timeout_s=*/-1); }

  void Enqueue(Work work) override { Push(Item(std::move(work))); }
  void OnComplete(Callback done) override { Push(Item(std::move(done))); }

  // The worker's clock when it reaches the start and the stop.
  class CpuTimer final : public Timer {
   public:
    explicit CpuTimer(CpuStream* stream) : stream_(stream), times_(std::make_shared<Times>()) {
      stream_->Enqueue([times = times_] {
        times->start = SteadyNowNs();
        return absl::OkStatus();
      });
    }
    void Stop() override {
      stream_->Enqueue([times = times_] {
        times->stop = SteadyNowNs();
        return absl::OkStatus();
      });
    }
    absl::StatusOr<int64_t> ElapsedNs() const override {
      if (times_->start == 0 || times_->stop == 0) return absl::FailedPreconditionError("timer not stopped");
      return times_->stop - times_->start;
    }

   private:
    struct Times {
      int64_t start = 0, stop = 0;  // written by the worker, read after a later callback
    };
    CpuStream* stream_;
    std::shared_ptr<Times> times_;
  };
  absl::StatusOr<std::unique_ptr<Timer>> StartTimer() override { return std::make_unique<CpuTimer>(this); }
  const std::string& name() const override { return name_; }
  int64_t busy_since_ns() const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->running_since_ns;
  }

  bool Shutdown(double timeout_s) override {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->stopping = true;
    state_->queue.clear();
    state_->cv.notify_all();
    if (!worker_.joinable()) return state_->exited;
    return internal::JoinStreamThread(
        lock, state_->cv, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_->exited; }, worker_, timeout_s);
  }

 private:
  using Item = std::variant<Work, Callback>;
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
    bool exited ABSL_GUARDED_BY(mu) = false;
    int64_t running_since_ns ABSL_GUARDED_BY(mu) = 0;
    absl::Status error;  // the worker's only: the first error, sticky
  };

  void Push(Item item) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->stopping) return;
      state_->queue.push_back(std::move(item));
    }
    state_->cv.notify_all();
  }

  static void Loop(State& state) {
    std::unique_lock<std::mutex> lock(state.mu);
    while (true) {
      state.cv.wait(
          lock, [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) { return state.stopping || !state.queue.empty(); });
      if (state.stopping) break;
      Item item = std::move(state.queue.front());
      state.queue.pop_front();
      state.running_since_ns = SteadyNowNs();
      lock.unlock();
      if (auto* work = std::get_if<Work>(&item)) {
        if (state.error.ok()) {
          // A kernel that throws fails its stream like one that returns an
          // error (the actor thread is not there to catch it).
          try {
            state.error = (*work)();
          } catch (const std::exception& e) {
            state.error = absl::InternalError(std::string("a kernel threw on its stream: ") + e.what());
          }
        }
      } else {
        std::get<Callback>(item)(state.error);
      }
      item = Item();  // what the work captured goes before the stream looks idle
      lock.lock();
      state.running_since_ns = 0;
    }
    state.exited = true;
    state.cv.notify_all();
  }

  std::string name_;
  std::shared_ptr<State> state_;
  std::thread worker_;
};

}  // namespace

namespace internal {
bool JoinStreamThread(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                      const std::function<bool()>& exited, std::thread& worker, double timeout_s) {
  bool finished = true;
  if (timeout_s < 0) {
    cv.wait(lock, exited);
  } else {
    finished = cv.wait_for(lock, std::chrono::duration<double>(timeout_s), exited);
  }
  lock.unlock();
  if (finished) {
    worker.join();
  } else {
    worker.detach();
  }
  return finished;
}
}  // namespace internal

std::unique_ptr<Stream> MakeCpuStream(std::string name) { return std::make_unique<CpuStream>(std::move(name)); }

#ifndef TESSERA_WITH_CUDA
absl::StatusOr<std::unique_ptr<Stream>> MakeCudaStream(int device, std::string name) {
  return absl::FailedPreconditionError("cuda:" + std::to_string(device) + " stream '" + name +
                                       "': this build has no CUDA support");
}
#endif

}  // namespace tessera
