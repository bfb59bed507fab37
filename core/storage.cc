#include "core/storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "core/status.h"
#include "core/text.h"

namespace tessera {

#ifdef TESSERA_WITH_CUDA
// core/cuda_allocator.cc
Allocator* CudaAllocatorForDevice(int index);
Allocator* PinnedHostAllocator();
absl::StatusOr<int> CudaDevices();
absl::Status CudaCopy(void* dst, const void* src, size_t bytes, int device);
absl::Status CudaZero(void* dst, int device, size_t bytes);
absl::Status CudaCopy2D(const std::vector<Copy2D>& copies, int device);
bool CudaBuilt() { return true; }
absl::StatusOr<int> CudaDeviceCount() { return CudaDevices(); }
#else
bool CudaBuilt() { return false; }
absl::StatusOr<int> CudaDeviceCount() {
  return absl::FailedPreconditionError("this build of Tessera has no CUDA support (nvcc was not found when it was built)");
}
#endif

absl::Status CopyBytes(void* dst, const Device& dst_device, const void* src, const Device& src_device, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst_device.type == DeviceType::kCpu && src_device.type == DeviceType::kCpu) {
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
#ifdef TESSERA_WITH_CUDA
  return CudaCopy(dst, src, bytes, dst_device.type == DeviceType::kCuda ? dst_device.index : src_device.index);
#else
  return absl::UnimplementedError(StrCat("copying ", src_device.ToString(), " -> ", dst_device.ToString(),
                                         ": this build of Tessera has no CUDA support"));
#endif
}

absl::Status ZeroBytes(void* dst, const Device& device, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (device.type == DeviceType::kCpu) {
    std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }
#ifdef TESSERA_WITH_CUDA
  return CudaZero(dst, device.index, bytes);
#else
  return absl::UnimplementedError(StrCat(device.ToString(), ": this build of Tessera has no CUDA support"));
#endif
}

absl::Status CopyBytes2D(const std::vector<Copy2D>& copies, const Device& dst_device, const Device& src_device) {
  if (dst_device.type == DeviceType::kCpu && src_device.type == DeviceType::kCpu) {
    for (const Copy2D& c : copies) {
      for (size_t row = 0; row < c.height; ++row) {
        std::memmove(static_cast<char*>(c.dst) + row * c.dst_pitch, static_cast<const char*>(c.src) + row * c.src_pitch,
                     c.width);
      }
    }
    return absl::OkStatus();
  }
#ifdef TESSERA_WITH_CUDA
  return CudaCopy2D(copies, dst_device.type == DeviceType::kCuda ? dst_device.index : src_device.index);
#else
  return absl::UnimplementedError(StrCat("copying ", src_device.ToString(), " -> ", dst_device.ToString(),
                                         ": this build of Tessera has no CUDA support"));
#endif
}

size_t PhysicalMemoryBytes() {
  static const size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGE_SIZE);
    // Unknown: no limit of our own (the allocator still reports failure).
    if (pages <= 0 || page_size <= 0) return std::numeric_limits<size_t>::max();
    return static_cast<size_t>(pages) * static_cast<size_t>(page_size);
  }();
  return bytes;
}

absl::StatusOr<void*> CpuAllocator::Allocate(size_t bytes) {
  // Refused before malloc sees it: a request beyond physical memory cannot
  // be served anyway, and sanitizers abort on huge requests instead of
  // returning null.
  if (bytes > PhysicalMemoryBytes()) {
    return absl::ResourceExhaustedError(StrCat("cpu: cannot allocate ", bytes, " bytes: more than the machine's ",
                                               PhysicalMemoryBytes(), " bytes of physical memory"));
  }
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded >= kMapBytes) {
    // Pages of their own: back to the system when freed, whatever malloc's
    // heap looks like (arenas, parameters: a job's memory is its plan's).
    void* ptr = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) return absl::ResourceExhaustedError(StrCat("cpu: out of memory mapping ", bytes, " bytes"));
    return ptr;
  }
  void* ptr = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(StrCat("cpu: out of memory allocating ", bytes, " bytes"));
  }
  return ptr;
}

void CpuAllocator::Deallocate(void* ptr, size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded >= kMapBytes) {
    ::munmap(ptr, rounded);
    return;
  }
  std::free(ptr);
}

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

absl::StatusOr<std::shared_ptr<Storage>> Storage::CreatePinned(size_t bytes) {
#ifdef TESSERA_WITH_CUDA
  Allocator* allocator = PinnedHostAllocator();
  ASSIGN_OR_RETURN(void* data, allocator->Allocate(bytes));
  return std::shared_ptr<Storage>(new Storage(allocator, Device{DeviceType::kCpu, 0}, data, bytes));
#else
  return Create(Device{DeviceType::kCpu, 0}, bytes);
#endif
}

Storage::~Storage() { allocator_->Deallocate(data_, bytes_); }

}  // namespace tessera
