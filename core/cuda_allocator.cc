// CUDA device memory through the runtime API. Compiled only with TESSERA_CUDA.
// Kept deliberately simple (cudaMalloc per block): the actor runtime allocates
// all registers once when a plan is loaded, so there is no hot-path allocation
// to amortise with a caching allocator.

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/text.h"
#include "core/storage.h"

namespace tessera {
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
