#pragma once
// Device memory: an Allocator per device type and Storage, a reference-counted
// block owned by whoever holds it (tensors share it through views).
//
// Allocators are thread-safe. A Storage is immutable after creation (its bytes
// are not), so sharing it across threads is safe; synchronising access to the
// bytes is the caller's business (the actor runtime's registers do it).

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace tessera {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory aligned to at least kAlignment bytes, or an error (never
  // null on success; a zero-byte request gets a valid unique pointer).
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Deallocate(void* ptr, size_t bytes) = 0;
  virtual DeviceType device_type() const = 0;

  static constexpr size_t kAlignment = 64;
};

// Host memory the machine has (physical RAM, read once).
size_t PhysicalMemoryBytes();

// The host memory this process may take: the least of the physical
// memory, the machine's available memory (MemAvailable) and what its
// cgroup's limit leaves (v2 memory.max less memory.current, v1 likewise),
// each with what the process holds resident added back (VmRSS: a later
// segment loads the trained values it holds and lets them go), and what its
// address-space and data limits leave (ulimit -v less VmSize, ulimit -d
// less VmData: mappings count at once), with which one it is ("the
// machine's available memory", "what ulimit -v leaves", ...). Read at each
// call.
struct HostMemoryLimit {
  size_t bytes = 0;
  std::string source;
};
HostMemoryLimit HostMemoryLimitNow();

// Aligned host memory (64 bytes: one cache line, one AVX-512 vector). A
// request beyond PhysicalMemoryBytes() is a ResourceExhausted error naming
// the bytes. Requests of kMapBytes or more get pages of their own (mmap),
// returned to the system when freed; Deallocate must get the size that was
// allocated.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kMapBytes = size_t{1} << 20;
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;
  DeviceType device_type() const override { return DeviceType::kCpu; }
};

// The process-wide allocator for a device; the CUDA one exists only when
// Tessera is built with TESSERA_CUDA (else an Unimplemented error).
absl::StatusOr<Allocator*> GetAllocator(const Device& device);
// Whether this build has CUDA support compiled in.
bool CudaBuilt();
// The GPUs this process sees: an error naming why there are none usable
// (no CUDA support built, no driver, no device).
absl::StatusOr<int> CudaDeviceCount();

// Copies `bytes` from `src` on `src_device` to `dst` on `dst_device` and
// waits for the copy: memmove between host buffers, the CUDA runtime when
// either side is a GPU (an error on builds without CUDA).
absl::Status CopyBytes(void* dst, const Device& dst_device, const void* src, const Device& src_device, size_t bytes);
// Zeroes `bytes` at `dst` on `device` (and waits).
absl::Status ZeroBytes(void* dst, const Device& device, size_t bytes);

// One 2-D piece of a strided copy: `height` rows of `width` bytes, the rows
// `src_pitch` and `dst_pitch` bytes apart (each at least `width`).
struct Copy2D {
  void* dst = nullptr;
  size_t dst_pitch = 0;
  const void* src = nullptr;
  size_t src_pitch = 0;
  size_t width = 0;
  size_t height = 0;
};
// Runs `copies` in order from `src_device` to `dst_device` and waits for
// them: row memcpys between host buffers, the CUDA runtime's 2-D copies
// (one queue, one wait) when either side is a GPU (an error on builds
// without CUDA).
absl::Status CopyBytes2D(const std::vector<Copy2D>& copies, const Device& dst_device, const Device& src_device);

// A block of memory on one device, freed through its allocator when the last
// reference goes away.
class Storage {
 public:
  static absl::StatusOr<std::shared_ptr<Storage>> Create(const Device& device, size_t bytes);
  // Create, the bytes zero. Host requests of CpuAllocator::kMapBytes or more
  // are fresh anonymous pages, zero already: not written here, so they
  // become resident only as they are first used (an arena's activation
  // bytes stay out of memory while a new run's parameters are loaded).
  static absl::StatusOr<std::shared_ptr<Storage>> CreateZeroed(const Device& device, size_t bytes);
  // Page-locked host memory (cudaHostAlloc; device cpu:0), which GPUs copy
  // from and to at full speed; plain host memory on builds without CUDA.
  static absl::StatusOr<std::shared_ptr<Storage>> CreatePinned(size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }

 private:
  Storage(Allocator* allocator, const Device& device, void* data, size_t bytes)
      : allocator_(allocator), device_(device), data_(data), bytes_(bytes) {}

  Allocator* allocator_;  // borrowed; allocators live for the process
  Device device_;
  void* data_;
  size_t bytes_;
};

}  // namespace tessera
