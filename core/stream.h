#pragma once
// Streams (DESIGN §8 "Async devices"): an in-order queue of a device's work.
// An actor whose task acts asynchronously (Task.async_acts) enqueues its
// act's kernels on its device's stream and asks to be called back when they
// completed; only then does it hand its registers on, so a consumer never
// sees data that is not ready, while the actor (and every other actor of its
// thread) goes on acting. Work on one stream runs in the order it was
// enqueued; a callback runs after everything enqueued before it.
//
//   CPU:  a worker thread of the stream runs each work item (the kernel
//         itself) and then the callbacks behind it (MakeCpuStream).
//   CUDA: the work item runs on the caller's thread and only launches the
//         kernels onto the stream's cudaStream (native()); a callback waits
//         on an event recorded behind them, on the stream's poller thread
//         (MakeCudaStream, compiled with CUDA only).
//
// Errors: a work item's error (or the device's) goes to the next callback;
// work enqueued after an error is skipped, not run, and its callbacks get
// that error too. Thread-safety: Enqueue and OnComplete from one thread at a
// time per stream in the order the work must run (the actors of one actor
// thread share a stream); callbacks run on the stream's own thread.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

class Stream {
 public:
  using Work = std::function<absl::Status()>;
  using Callback = std::function<void(absl::Status)>;

  virtual ~Stream() = default;
  // Queues `work` behind everything enqueued before.
  virtual void Enqueue(Work work) = 0;
  // Calls `done` once everything enqueued before completed, with the first
  // error among it (OK when none), on the stream's thread. After Shutdown
  // callbacks are dropped, not called.
  virtual void OnComplete(Callback done) = 0;
  // What kernels launch on: the cudaStream_t of a CUDA stream; null on CPU
  // (the kernel runs on the calling thread, which is the stream's).
  virtual void* native() const { return nullptr; }
  // Profiling: the time the stream spends on the work enqueued between
  // StartTimer and the timer's Stop (a CUDA stream's device time, between
  // events recorded around it; a CPU stream's worker time). ElapsedNs is
  // valid once the stop completed: in a callback queued after it.
  class Timer {
   public:
    virtual ~Timer() = default;
    virtual void Stop() = 0;
    virtual absl::StatusOr<int64_t> ElapsedNs() const = 0;
  };
  virtual absl::StatusOr<std::unique_ptr<Timer>> StartTimer() = 0;
  // "cpu:0 stream 0"
  virtual const std::string& name() const = 0;
  // For the watchdog: since when (steady clock, ns) the stream has had work
  // not completed; 0 when it is idle.
  virtual int64_t busy_since_ns() const = 0;
  // Skips work not started and drops callbacks not yet called, waits for
  // what is running now (at most `timeout_s`; false when it did not finish).
  // Idempotent; the destructor calls it.
  virtual bool Shutdown(double timeout_s) = 0;
};

// A CPU stream: one worker thread running work and callbacks in order.
std::unique_ptr<Stream> MakeCpuStream(std::string name);

// A CUDA stream on GPU `device` with its event poller (an error on builds
// without CUDA, or without that GPU).
absl::StatusOr<std::unique_ptr<Stream>> MakeCudaStream(int device, std::string name);

// Steady-clock nanoseconds (the clock of busy_since_ns).
int64_t SteadyNowNs();

namespace internal {
// A stream's Shutdown, once it told its thread to stop: waits with `lock`
// (on the mutex `cv` is used with) until `exited()`, at most `timeout_s`
// (< 0: as long as it takes), then joins `worker`, or detaches it when it
// did not exit (it keeps its shared state). Returns whether it exited.
bool JoinStreamThread(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                      const std::function<bool()>& exited, std::thread& worker, double timeout_s);
}  // namespace internal

}  // namespace tessera
