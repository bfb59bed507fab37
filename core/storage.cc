#include "core/storage.h"

#include <cstdlib>
#include <new>

#include "core/text.h"

namespace tessera {

#ifdef TESSERA_WITH_CUDA
Allocator* CudaAllocatorForDevice(int index);  // core/cuda_allocator.cc
bool CudaBuilt() { return true; }
#else
bool CudaBuilt() { return false; }
#endif

absl::StatusOr<void*> CpuAllocator::Allocate(size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* ptr = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(StrCat("cpu: out of memory allocating ", bytes, " bytes"));
  }
  return ptr;
}

void CpuAllocator::Deallocate(void* ptr, size_t) { std::free(ptr); }

absl::StatusOr<Allocator*> GetAllocator(const Device& device) {
  if (device.type == DeviceType::kCpu) {
    // Stateless, so one shared instance for every virtual CPU device is fine.
    static CpuAllocator* const cpu = new CpuAllocator();
    return cpu;
  }
#ifdef TESSERA_WITH_CUDA
  return CudaAllocatorForDevice(device.index);
#else
  return absl::UnimplementedError(
      StrCat("device ", device.ToString(), ": this build of Tessera has no CUDA support"));
#endif
}

absl::StatusOr<std::shared_ptr<Storage>> Storage::Create(const Device& device, size_t bytes) {
  Allocator* allocator = nullptr;
  {
    auto a = GetAllocator(device);
    if (!a.ok()) return a.status();
    allocator = *a;
  }
  auto data = allocator->Allocate(bytes);
  if (!data.ok()) return data.status();
  return std::shared_ptr<Storage>(new Storage(allocator, device, *data, bytes));
}

Storage::~Storage() { allocator_->Deallocate(data_, bytes_); }

}  // namespace tessera
