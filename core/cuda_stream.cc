// The CUDA stream (core/stream.h). Compiled only with TESSERA_CUDA.
//
// Enqueue runs the work item on the caller's thread, with the stream's GPU
// current: the kernels' host sides launch onto native() and return without
// waiting. OnComplete records an event behind what was launched and hands it
// to the stream's poller thread, which waits for it (a blocking-sync event:
// the thread sleeps, it does not spin) and then calls the callback with the
// launches' first error or the device's (a kernel fault is reported by the
// event's wait). Callbacks therefore run in enqueue order, after their work.

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "core/status.h"
#include "core/storage.h"
#include "core/stream.h"
#include "core/text.h"

namespace tessera {
namespace {

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(StrCat(what, ": ", cudaGetErrorString(err)));
}

class CudaStream final : public Stream {
 public:
  CudaStream(int device, cudaStream_t stream, std::string name)
      : device_(device), stream_(stream), name_(std::move(name)), state_(std::make_shared<State>()) {
    poller_ = std::thread([state = state_, device] { Poll(*state, device); });
  }
  ~CudaStream() override {
    Shutdown(/*timeout_s=*/-1);
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
  }

  void Enqueue(Work work) override {
    if (!launch_error_.ok()) return;  // skipped behind an error
    if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
      launch_error_ = CudaStatus(err, StrCat(name_, ": cudaSetDevice"));
      return;
    }
    launch_error_ = work();
  }

  void OnComplete(Callback done) override {
    cudaEvent_t event = nullptr;
    absl::Status status = launch_error_;
    if (status.ok()) {
      status = CudaStatus(cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming),
                          StrCat(name_, ": cudaEventCreate"));
    }
    if (status.ok()) status = CudaStatus(cudaEventRecord(event, stream_), StrCat(name_, ": cudaEventRecord"));
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->stopping) {
      if (event != nullptr) cudaEventDestroy(event);
      return;
    }
    const int64_t now = SteadyNowNs();
    if (state_->queue.empty() && !state_->in_flight) state_->busy_since_ns = now;
    state_->queue.push_back({event, std::move(status), std::move(done), now});
    state_->cv.notify_all();
  }

  // Events with timing around the work.
  class CudaTimer final : public Timer {
   public:
    CudaTimer(int device, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop)
        : device_(device), stream_(stream), start_(start), stop_(stop) {}
    ~CudaTimer() override {
      cudaSetDevice(device_);
      cudaEventDestroy(start_);
      cudaEventDestroy(stop_);
    }
    void Stop() override {
      cudaSetDevice(device_);
      stopped_ = cudaEventRecord(stop_, stream_) == cudaSuccess;
    }
    absl::StatusOr<int64_t> ElapsedNs() const override {
      if (!stopped_) return absl::FailedPreconditionError("timer not stopped");
      cudaSetDevice(device_);
      float ms = 0;
      RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime"));
      return static_cast<int64_t>(static_cast<double>(ms) * 1e6);
    }

   private:
    int device_;
    cudaStream_t stream_;
    cudaEvent_t start_, stop_;
    bool stopped_ = false;
  };
  absl::StatusOr<std::unique_ptr<Timer>> StartTimer() override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), StrCat(name_, ": cudaSetDevice")));
    cudaEvent_t start = nullptr, stop = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), StrCat(name_, ": cudaEventCreate")));
    if (cudaError_t err = cudaEventCreate(&stop); err != cudaSuccess) {
      cudaEventDestroy(start);
      return CudaStatus(err, StrCat(name_, ": cudaEventCreate"));
    }
    auto timer = std::make_unique<CudaTimer>(device_, stream_, start, stop);
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start, stream_), StrCat(name_, ": cudaEventRecord")));
    return timer;
  }

  void* native() const override { return stream_; }
  const std::string& name() const override { return name_; }
  int64_t busy_since_ns() const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->busy_since_ns;
  }

  bool Shutdown(double timeout_s) override {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->stopping = true;
    state_->cv.notify_all();
    if (!poller_.joinable()) return state_->exited;
    const bool joined = internal::JoinStreamThread(
        lock, state_->cv, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_->exited; }, poller_, timeout_s);
    if (!joined) {
      // The poller, left waiting on a kernel, calls nothing from now on; a
      // callback it was inside (a message sent) ends before this returns.
      std::unique_lock<std::mutex> again(state_->mu);
      state_->cv.wait(again, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !state_->calling; });
    }
    return joined;
  }

 private:
  struct Pending {
    cudaEvent_t event;
    absl::Status status;  // the launches' error, if any
    Callback done;
    int64_t since_ns = 0;  // when it was queued
  };
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Pending> queue ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
    bool exited ABSL_GUARDED_BY(mu) = false;
    // The oldest work not complete: the poller's (popped, waited on) or
    // the queue's front; 0 when none.
    int64_t busy_since_ns ABSL_GUARDED_BY(mu) = 0;
    bool in_flight ABSL_GUARDED_BY(mu) = false;  // the poller waits on a popped one
    bool calling ABSL_GUARDED_BY(mu) = false;    // the poller is inside a callback
  };

  // Waits for each event in turn; once stopping, drops what is left (each
  // event still waited for, so nothing on the GPU outlives the stream's
  // registers unnoticed).
  static void Poll(State& state, int device) {
    cudaSetDevice(device);
    absl::Status sticky;
    std::unique_lock<std::mutex> lock(state.mu);
    while (true) {
      state.cv.wait(
          lock, [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) { return state.stopping || !state.queue.empty(); });
      if (state.queue.empty()) break;  // stopping and drained
      Pending pending = std::move(state.queue.front());
      state.queue.pop_front();
      state.in_flight = true;
      state.busy_since_ns = pending.since_ns;
      lock.unlock();
      absl::Status status = std::move(pending.status);
      if (pending.event != nullptr) {
        absl::Status waited = CudaStatus(cudaEventSynchronize(pending.event), "a kernel on the stream failed");
        if (status.ok()) status = std::move(waited);
        cudaEventDestroy(pending.event);
      }
      if (sticky.ok()) sticky = status;
      // (Stopping is read after the wait: a Shutdown that gave up on this
      // kernel meanwhile returned, and the callback's actor may be gone.)
      lock.lock();
      const bool call = !state.stopping;
      state.calling = call;
      lock.unlock();
      if (call) pending.done(sticky);
      pending = Pending();
      lock.lock();
      state.calling = false;
      state.in_flight = false;
      state.busy_since_ns = state.queue.empty() ? 0 : state.queue.front().since_ns;
      state.cv.notify_all();
    }
    state.exited = true;
    state.cv.notify_all();
  }

  int device_;
  cudaStream_t stream_;
  std::string name_;
  absl::Status launch_error_;  // the enqueuing thread's
  std::shared_ptr<State> state_;
  std::thread poller_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Stream>> MakeCudaStream(int device, std::string name) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) return absl::FailedPreconditionError(StrCat(name, ": ", devices.status().message()));
  const int count = *devices;
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(StrCat(name, ": no GPU cuda:", device, " (", count, " present)"));
  }
  cudaStream_t stream = nullptr;
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaStatus(err, StrCat(name, ": cudaStreamCreate"));
  return std::unique_ptr<Stream>(new CudaStream(device, stream, std::move(name)));
}

}  // namespace tessera
