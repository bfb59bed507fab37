// The CUDA emulator's runtime (cuda_runtime_api.h): devices, memory,
// streams as host threads with ordered queues, events.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_emu/internal.h"

namespace cuda_emu {
namespace {

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

}  // namespace

// The machine's GPUs (TESSERA_CUDA_EMU_DEVICES, 2 by default), narrowed as
// CUDA's runtime narrows them by CUDA_VISIBLE_DEVICES: the listed indices
// up to the first that is not a distinct GPU of the machine (the emulator
// knows no UUIDs).
int DeviceCount() {
  static const int count = [] {
    int machine = 2;
    if (const char* env = std::getenv("TESSERA_CUDA_EMU_DEVICES"); env != nullptr && *env != '\0') {
      char* end = nullptr;
      const long n = std::strtol(env, &end, 10);
      if (*end == '\0' && n >= 0 && n <= 64) machine = static_cast<int>(n);
    }
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible == nullptr) return machine;
    std::vector<bool> seen(static_cast<size_t>(machine), false);
    int shown = 0;
    for (const char* p = visible; *p != '\0';) {
      char* end = nullptr;
      const long index = std::strtol(p, &end, 10);
      if (end == p || (*end != ',' && *end != '\0') || index < 0 || index >= machine ||
          seen[static_cast<size_t>(index)]) {
        break;
      }
      seen[static_cast<size_t>(index)] = true;
      ++shown;
      p = *end == ',' ? end + 1 : end;
    }
    return shown;
  }();
  return count;
}

int CurrentDevice() { return current_device; }

cudaError_t SetLastError(cudaError_t error) {
  if (error != cudaSuccess && last_error == cudaSuccess) last_error = error;
  return error;
}

}  // namespace cuda_emu

using cuda_emu::Task;

// A stream: a host thread running its queue in order.
struct CUstream_st {
  struct Entry {
    Task task;
    bool always = false;  // runs after an error too (event records, frees)
  };

  CUstream_st(int device, bool blocking) : device(device), blocking(blocking) {
    worker = std::thread([this] { Run(); });
    worker.detach();  // it deletes this stream once destroyed and drained
  }

  void Push(Task task, bool always) {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(Entry{std::move(task), always});
    ++queued;
    cv.notify_all();
  }

  // Waits for what was queued before the call; returns the sticky error.
  cudaError_t Sync() {
    std::unique_lock<std::mutex> lock(mu);
    const uint64_t target = queued;
    cv.wait(lock, [&] { return done >= target; });
    return error;
  }

  cudaError_t Query() {
    std::lock_guard<std::mutex> lock(mu);
    if (error != cudaSuccess) return error;
    return done == queued ? cudaSuccess : cudaErrorNotReady;
  }

  // No more work may be queued; the worker drains the queue, then deletes
  // the stream.
  void Retire() {
    std::lock_guard<std::mutex> lock(mu);
    retired = true;
    cv.notify_all();
  }

  void Run() {
    cudaSetDevice(device);
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return !queue.empty() || retired; });
      if (queue.empty()) break;
      Entry entry = std::move(queue.front());
      queue.pop_front();
      const bool skip = error != cudaSuccess && !entry.always;
      lock.unlock();
      cudaError_t err = skip ? cudaSuccess : entry.task();
      entry.task = nullptr;  // captured buffers go before the next task
      lock.lock();
      if (err != cudaSuccess && error == cudaSuccess) error = err;
      ++done;
      cv.notify_all();
    }
    lock.unlock();
    delete this;
  }

  const int device;
  const bool blocking;  // synchronises with cudaMemcpy / cudaMemset (the legacy stream)
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Entry> queue;
  uint64_t queued = 0, done = 0;
  cudaError_t error = cudaSuccess;
  bool retired = false;
};

struct CUevent_st {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  cudaError_t error = cudaSuccess;
  bool timing = true;                                    // not cudaEventDisableTiming
  std::chrono::steady_clock::time_point completed_at{};  // when the stream reached it
};

namespace cuda_emu {
namespace {

struct Allocation {
  size_t bytes = 0;
  int device = -1;  // -1: page-locked host memory
};

// Never destroyed: detached stream threads may outlive static destruction.
struct Registry {
  std::mutex mu;
  std::set<CUstream_st*> streams;
  std::map<const char*, Allocation> allocations;
  std::set<CUevent_st*> events;
  std::map<const void*, int> shared_limits;
  std::set<std::pair<int, std::string>> loaded;  // (device, function or module) loaded there
};
Registry& Reg() {
  static Registry* registry = new Registry;
  return *registry;
}

// A device's context lock: loading a function holds it while it waits for
// the device, and every call that queues work for the device waits for it,
// as the real runtime's calls wait behind a module load in the context.
std::mutex& ContextLock(int device) {
  static std::mutex* locks = new std::mutex[64];
  return locks[static_cast<size_t>(device) % 64];
}

void Submit(CUstream_st* s, Task task, bool always) {
  std::lock_guard<std::mutex> context(ContextLock(s->device));
  s->Push(std::move(task), always);
}

// The calling thread's default streams, one per device; retired when the
// thread exits.
struct ThreadStreams {
  std::map<int, CUstream_st*> streams;
  ~ThreadStreams() {
    std::lock_guard<std::mutex> lock(Reg().mu);
    for (auto& [device, stream] : streams) {
      Reg().streams.erase(stream);
      stream->Retire();
    }
  }
};
thread_local ThreadStreams thread_streams;

bool Special(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

// The stream a handle names, null when unknown.
CUstream_st* Resolve(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  if (Special(stream)) {
    CUstream_st*& own = thread_streams.streams[current_device];
    if (own == nullptr) {
      own = new CUstream_st(current_device, /*blocking=*/true);
      Reg().streams.insert(own);
    }
    return own;
  }
  return Reg().streams.count(stream) != 0 ? stream : nullptr;
}

// A device's streams: the blocking ones (those the legacy default stream
// waits for: cudaMemcpy, cudaMemset), or all (cudaFree, a device sync).
std::vector<CUstream_st*> StreamsOf(int device, bool all) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  std::vector<CUstream_st*> out;
  for (CUstream_st* s : Reg().streams) {
    if (s->device == device && (all || s->blocking)) out.push_back(s);
  }
  return out;
}

cudaError_t SyncAll(const std::vector<CUstream_st*>& streams) {
  cudaError_t first = cudaSuccess;
  for (CUstream_st* s : streams) {
    const cudaError_t err = s->Sync();
    if (first == cudaSuccess) first = err;
  }
  return first;
}

// Whether [p, p + bytes) lies in memory of the emulator's allocations, and
// which: 1 device, 2 page-locked host, 0 neither (pageable host memory).
int KindOf(const void* p) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  const char* c = static_cast<const char*>(p);
  auto it = Reg().allocations.upper_bound(c);
  if (it == Reg().allocations.begin()) return 0;
  --it;
  if (c >= it->first + std::max<size_t>(it->second.bytes, 1)) return 0;
  return it->second.device >= 0 ? 1 : 2;
}

cudaError_t Allocate(void** ptr, size_t bytes, int device) {
  if (ptr == nullptr) return SetLastError(cudaErrorInvalidValue);
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return SetLastError(cudaErrorMemoryAllocation);
  if (device >= 0) std::memset(p, 0xff, rounded);
  std::lock_guard<std::mutex> lock(Reg().mu);
  Reg().allocations[static_cast<const char*>(p)] = Allocation{bytes, device};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t Release(void* ptr, bool device) {
  if (ptr == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(Reg().mu);
  auto it = Reg().allocations.find(static_cast<const char*>(ptr));
  if (it == Reg().allocations.end() || (it->second.device >= 0) != device) {
    return SetLastError(device ? cudaErrorInvalidDevicePointer : cudaErrorInvalidValue);
  }
  Reg().allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

// A copy touching pageable host memory behaves as the real one: the call
// waits for the stream's earlier work and copies before it returns.
cudaError_t Copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                   cudaStream_t stream) {
  if (height > 0 && width > 0 && (dst == nullptr || src == nullptr)) return SetLastError(cudaErrorInvalidValue);
  if (height > 1 && (dpitch < width || spitch < width)) return SetLastError(cudaErrorInvalidValue);
  CUstream_st* s = Resolve(stream);
  if (s == nullptr) return SetLastError(cudaErrorInvalidResourceHandle);
  auto copy = [=]() -> cudaError_t {
    for (size_t r = 0; r < height; ++r) {
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    }
    return cudaSuccess;
  };
  if (width == 0 || height == 0) return cudaSuccess;
  if (KindOf(dst) == 0 || KindOf(src) == 0) {
    if (const cudaError_t err = s->Sync(); err != cudaSuccess) return SetLastError(err);
    return copy();
  }
  Submit(s, copy, false);
  return cudaSuccess;
}

}  // namespace

cudaError_t Enqueue(cudaStream_t stream, Task task) {
  CUstream_st* s = Resolve(stream);
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  Submit(s, std::move(task), false);
  return cudaSuccess;
}

int StreamDevice(cudaStream_t stream) {
  if (Special(stream)) return current_device;
  std::lock_guard<std::mutex> lock(Reg().mu);
  return Reg().streams.count(stream) != 0 ? stream->device : -1;
}

bool LazyLoading() {
  static const bool lazy = [] {
    const char* env = std::getenv("CUDA_MODULE_LOADING");
    return env == nullptr || std::strcmp(env, "EAGER") != 0;
  }();
  return lazy;
}

void LoadFunction(int device, const std::string& function) {
  if (LazyLoading()) LoadModule(device, function);
}

void LoadModule(int device, const std::string& function) {
  if (device < 0) return;
  const std::pair<int, std::string> key{device, function};
  {
    std::lock_guard<std::mutex> lock(Reg().mu);
    if (Reg().loaded.count(key) != 0) return;
  }
  std::lock_guard<std::mutex> context(ContextLock(device));
  {
    std::lock_guard<std::mutex> lock(Reg().mu);
    if (Reg().loaded.count(key) != 0) return;  // another thread loaded it meanwhile
  }
  SyncAll(StreamsOf(device, true));  // the streams keep their errors; the load itself succeeds
  std::lock_guard<std::mutex> lock(Reg().mu);
  Reg().loaded.insert(key);
}

std::string FunctionName(const void* kernel) { return "kernel@" + std::to_string(reinterpret_cast<uintptr_t>(kernel)); }

// kernel.cc reads a kernel's dynamic shared memory limit.
int SharedMemoryLimit(const void* kernel) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  auto it = Reg().shared_limits.find(kernel);
  return it == Reg().shared_limits.end() ? 48 * 1024 : it->second;
}

}  // namespace cuda_emu

using namespace cuda_emu;  // NOLINT: the C API below is global

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorAssert:
      return "cudaErrorAssert";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorUnknown:
      return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected (emulator: TESSERA_CUDA_EMU_DEVICES=0, or CUDA_VISIBLE_DEVICES shows "
             "none)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorAssert:
      return "device-side assert triggered";
    default:
      return cudaGetErrorName(error);
  }
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return last_error; }

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return SetLastError(cudaErrorInvalidValue);
  *count = DeviceCount();
  return *count == 0 ? SetLastError(cudaErrorNoDevice) : cudaSuccess;
}

// The emulator stands in for a driver of its own CUDA version.
cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return SetLastError(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (DeviceCount() == 0) return SetLastError(cudaErrorNoDevice);
  if (device < 0 || device >= DeviceCount()) return SetLastError(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return SetLastError(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return SetLastError(SyncAll(StreamsOf(current_device, true))); }

cudaError_t cudaMalloc(void** ptr, size_t bytes) { return Allocate(ptr, bytes, current_device); }

// cudaFree waits for the device's work, as the real one does.
cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  SyncAll(StreamsOf(current_device, true));
  return Release(ptr, true);
}

cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream) {
  if (Resolve(stream) == nullptr) return SetLastError(cudaErrorInvalidResourceHandle);
  return Allocate(ptr, bytes, current_device);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  CUstream_st* s = Resolve(stream);
  if (s == nullptr) return SetLastError(cudaErrorInvalidResourceHandle);
  if (ptr != nullptr && KindOf(ptr) != 1) return SetLastError(cudaErrorInvalidValue);
  Submit(
      s, [ptr] { return Release(ptr, true); }, true);
  return cudaSuccess;
}

// Page-locked allocations wait for the current device's work, as cudaFree:
// cudaFreeHost synchronises the device, and a page-locked allocation keeps
// the device's later work from overlapping its earlier work (CUDA's
// implicit synchronisation), which the emulator cannot order otherwise.
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int) {
  SyncAll(StreamsOf(current_device, true));
  return Allocate(ptr, bytes, -1);
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }
cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  SyncAll(StreamsOf(current_device, true));
  return Release(ptr, false);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return SetLastError(cudaErrorInvalidValue);
  if (const cudaError_t err = SyncAll(StreamsOf(current_device, false)); err != cudaSuccess) return SetLastError(err);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  return Copy2D(dst, bytes, src, bytes, bytes, 1, stream);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t stream) {
  return Copy2D(dst, dpitch, src, spitch, width, height, stream);
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || KindOf(dst) != 1) return SetLastError(cudaErrorInvalidValue);
  if (const cudaError_t err = SyncAll(StreamsOf(current_device, false)); err != cudaSuccess) return SetLastError(err);
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || KindOf(dst) != 1) return SetLastError(cudaErrorInvalidValue);
  CUstream_st* s = Resolve(stream);
  if (s == nullptr) return SetLastError(cudaErrorInvalidResourceHandle);
  Submit(
      s,
      [=] {
        std::memset(dst, value, bytes);
        return cudaSuccess;
      },
      false);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return SetLastError(cudaErrorInvalidValue);
  auto* s = new CUstream_st(current_device, (flags & cudaStreamNonBlocking) == 0);
  std::lock_guard<std::mutex> lock(Reg().mu);
  Reg().streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

// Returns at once; the queued work still runs, as on a GPU.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (Special(stream)) return SetLastError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(Reg().mu);
  if (Reg().streams.erase(stream) == 0) return SetLastError(cudaErrorInvalidResourceHandle);
  stream->Retire();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = Resolve(stream);
  if (s == nullptr) return SetLastError(cudaErrorInvalidResourceHandle);
  return SetLastError(s->Sync());
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = Resolve(stream);
  if (s == nullptr) return SetLastError(cudaErrorInvalidResourceHandle);
  return s->Query();
}

namespace {

bool KnownEvent(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  return Reg().events.count(event) != 0;
}

}  // namespace

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  CUstream_st* s = Resolve(stream);
  if (s == nullptr || !KnownEvent(event)) return SetLastError(cudaErrorInvalidResourceHandle);
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(event->mu);
    target = event->recorded;
  }
  Submit(
      s,
      [event, target] {
        std::unique_lock<std::mutex> lock(event->mu);
        event->cv.wait(lock, [&] { return event->completed >= target; });
        return cudaSuccess;
      },
      false);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return SetLastError(cudaErrorInvalidValue);
  CUstream_st* s = Resolve(stream);
  if (s == nullptr) return SetLastError(cudaErrorInvalidResourceHandle);
  Submit(
      s,
      [fn, user_data] {
        fn(user_data);
        return cudaSuccess;
      },
      false);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return SetLastError(cudaErrorInvalidValue);
  }
  auto* e = new CUevent_st;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  std::lock_guard<std::mutex> lock(Reg().mu);
  Reg().events.insert(e);
  *event = e;
  return cudaSuccess;
}

// The event completes once the stream's earlier work did, carrying the
// stream's error.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  CUstream_st* s = Resolve(stream);
  if (s == nullptr || !KnownEvent(event)) return SetLastError(cudaErrorInvalidResourceHandle);
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(event->mu);
    generation = ++event->recorded;
  }
  Submit(
      s,
      [event, generation, s] {
        cudaError_t stream_error;
        {
          std::lock_guard<std::mutex> lock(s->mu);
          stream_error = s->error;
        }
        std::lock_guard<std::mutex> lock(event->mu);
        event->completed = std::max(event->completed, generation);
        event->completed_at = std::chrono::steady_clock::now();
        event->error = stream_error;
        event->cv.notify_all();
        return cudaSuccess;
      },
      true);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!KnownEvent(event)) return SetLastError(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> lock(event->mu);
  const uint64_t target = event->recorded;
  event->cv.wait(lock, [&] { return event->completed >= target; });
  return SetLastError(event->error);
}

// The host time between the streams reaching the two events (as a GPU's:
// both recorded, completed and made without cudaEventDisableTiming).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return SetLastError(cudaErrorInvalidValue);
  if (!KnownEvent(start) || !KnownEvent(end)) return SetLastError(cudaErrorInvalidResourceHandle);
  std::chrono::steady_clock::time_point times[2];
  cudaEvent_t events[2] = {start, end};
  for (int i = 0; i < 2; ++i) {
    std::lock_guard<std::mutex> lock(events[i]->mu);
    if (!events[i]->timing || events[i]->recorded == 0) return SetLastError(cudaErrorInvalidResourceHandle);
    if (events[i]->completed < events[i]->recorded) return cudaErrorNotReady;
    times[i] = events[i]->completed_at;
  }
  *ms = std::chrono::duration<float, std::milli>(times[1] - times[0]).count();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!KnownEvent(event)) return SetLastError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(event->mu);
  if (event->completed < event->recorded) return cudaErrorNotReady;
  return event->error;
}

// Waits for the event's recorded work first (a task may still hold it).
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  {
    std::lock_guard<std::mutex> lock(Reg().mu);
    if (Reg().events.erase(event) == 0) return SetLastError(cudaErrorInvalidResourceHandle);
  }
  {
    std::unique_lock<std::mutex> lock(event->mu);
    event->cv.wait(lock, [&] { return event->completed >= event->recorded; });
  }
  delete event;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024) {
    return SetLastError(cudaErrorInvalidValue);
  }
  LoadFunction(current_device, FunctionName(func));  // setting an attribute loads the function
  std::lock_guard<std::mutex> lock(Reg().mu);
  Reg().shared_limits[func] = value;
  return cudaSuccess;
}
