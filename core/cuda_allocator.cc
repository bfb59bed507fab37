// CUDA device memory through the runtime API. Compiled only with TESSERA_CUDA.
// Kept deliberately simple (cudaMalloc per block): the actor runtime allocates
// all registers once when a plan is loaded, so there is no hot-path allocation
// to amortise with a caching allocator.

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "core/storage.h"
#include "core/text.h"

namespace tessera {

// Eager module loading for every process with Tessera's CUDA code. Under
// lazy loading (CUDA_MODULE_LOADING=LAZY, CUDA's default since 12.2) the
// first launch of a kernel on a GPU loads it there, and the load may wait
// for everything queued on that GPU, on any stream. An NCCL collective
// queued on a collective stream waits for its peers, and the peers may be
// waiting for work this GPU has not launched yet: its compute thread is
// held by the load, and every other thread's call for the GPU waits behind
// the load. The job hangs in its first iteration (the CUDA emulator, which
// synchronises on each first launch, hangs gpt2_nano's pipeline layout
// over two GPUs so). EAGER loads every kernel when the CUDA runtime starts,
// before any collective: it costs start-up time and GPU memory for kernels
// never launched. The runtime reads the variable once, at its start, which
// comes after this initialiser; a value the user set is kept
// (comm/collective/nccl_communicator.cc warns when it is not EAGER).
const bool kEagerCudaModuleLoading = [] { return setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0) == 0; }();

namespace {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    cudaError_t err = cudaSetDevice(index_);
    void* ptr = nullptr;
    if (err == cudaSuccess) err = cudaMalloc(&ptr, bytes == 0 ? kAlignment : bytes);
    if (err != cudaSuccess) {
      return absl::ResourceExhaustedError(StrCat("cuda:", index_, ": cudaMalloc(", bytes,
                                                       ") failed: ", cudaGetErrorString(err)));
    }
    return ptr;
  }
  void Deallocate(void* ptr, size_t) override {
    cudaSetDevice(index_);
    cudaFree(ptr);
  }
  DeviceType device_type() const override { return DeviceType::kCuda; }

 private:
  int index_;
};

}  // namespace

namespace {
// Page-locked host memory for staging copies to and from GPUs.
class PinnedAllocator final : public Allocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t err = cudaHostAlloc(&ptr, bytes == 0 ? kAlignment : bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      return absl::ResourceExhaustedError(StrCat("cudaHostAlloc(", bytes, ") failed: ", cudaGetErrorString(err)));
    }
    return ptr;
  }
  void Deallocate(void* ptr, size_t) override { cudaFreeHost(ptr); }
  DeviceType device_type() const override { return DeviceType::kCpu; }
};
}  // namespace

Allocator* PinnedHostAllocator() {
  static auto* const pinned = new PinnedAllocator();
  return pinned;
}

absl::StatusOr<int> CudaDevices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
    // The runtime says "driver version is insufficient" also when there is
    // no driver at all, as on a machine without a GPU.
    int driver = 0;
    cudaDriverGetVersion(&driver);
    if (driver == 0) {
      return absl::FailedPreconditionError(
          StrCat("no CUDA device: no NVIDIA driver on this machine (", cudaGetErrorString(err), ")"));
    }
    if (err == cudaErrorInsufficientDriver) {
      return absl::FailedPreconditionError(StrCat("no CUDA device: the NVIDIA driver supports CUDA ", driver / 1000,
                                                  ".", driver % 1000 / 10, ", older than this build's CUDA ",
                                                  CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10));
    }
  }
  if (err != cudaSuccess) return absl::FailedPreconditionError(StrCat("no CUDA device: ", cudaGetErrorString(err)));
  if (count == 0) return absl::FailedPreconditionError("no CUDA device: the driver sees no GPU");
  return count;
}

// Both on the calling thread's default stream of `device` (the GPU side of
// the copy; the thread may have been on another one), waited for:
// cudaMemcpy alone returns before a device-to-device copy is done, and its
// legacy stream does not order the non-blocking streams kernels run on.
absl::Status CudaCopy(void* dst, const void* src, size_t bytes, int device) {
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamPerThread);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
  if (err != cudaSuccess) return absl::InternalError(StrCat("cudaMemcpy of ", bytes, " bytes: ", cudaGetErrorString(err)));
  return absl::OkStatus();
}

absl::Status CudaZero(void* dst, int device, size_t bytes) {
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaMemsetAsync(dst, 0, bytes, cudaStreamPerThread);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
  if (err != cudaSuccess) return absl::InternalError(StrCat("cuda:", device, ": zeroing ", bytes, " bytes: ", cudaGetErrorString(err)));
  return absl::OkStatus();
}

// Queued on the calling thread's default stream of `device`, one wait at
// the end.
absl::Status CudaCopy2D(const std::vector<Copy2D>& copies, int device) {
  cudaError_t err = cudaSetDevice(device);
  for (size_t i = 0; i < copies.size() && err == cudaSuccess; ++i) {
    const Copy2D& c = copies[i];
    if (c.width == 0 || c.height == 0) continue;
    err = cudaMemcpy2DAsync(c.dst, c.dst_pitch, c.src, c.src_pitch, c.width, c.height, cudaMemcpyDefault,
                            cudaStreamPerThread);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
  if (err != cudaSuccess) {
    return absl::InternalError(
        StrCat("cuda:", device, ": a strided copy of ", copies.size(), " piece(s): ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

Allocator* CudaAllocatorForDevice(int index) {
  static std::mutex mu;
  static auto* allocators = new std::vector<std::unique_ptr<CudaAllocator>>();
  std::lock_guard<std::mutex> lock(mu);
  if (allocators->size() <= static_cast<size_t>(index)) allocators->resize(static_cast<size_t>(index) + 1);
  auto& slot = (*allocators)[static_cast<size_t>(index)];
  if (!slot) slot = std::make_unique<CudaAllocator>(index);
  return slot.get();
}

}  // namespace tessera
