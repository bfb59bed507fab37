#include "core/storage.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <string_view>

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

namespace {

// A cgroup limit file's number; nullopt for "max", a missing file or text.
std::optional<size_t> ReadLimitFile(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
  if (errno != 0) return std::nullopt;
  return static_cast<size_t>(value);
}

}  // namespace

// A "Name:   N kB" line of a /proc file, in bytes.
static std::optional<size_t> ReadProcKiB(const char* path, std::string_view name) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(name) || line.size() <= name.size() || line[name.size()] != ':') continue;
    errno = 0;
    const unsigned long long kib = std::strtoull(line.c_str() + name.size() + 1, nullptr, 10);
    if (errno != 0) return std::nullopt;
    return static_cast<size_t>(kib) * 1024;
  }
  return std::nullopt;
}

HostMemoryLimit HostMemoryLimitNow() {
  HostMemoryLimit limit{PhysicalMemoryBytes(), "physical memory"};
  const auto lower = [&limit](std::optional<size_t> bytes, const char* source) {
    if (bytes && *bytes < limit.bytes) limit = {*bytes, source};
  };
  // What the machine can still give (free, and caches it can drop), with
  // what this process holds resident: a later segment's check counts the
  // trained values it holds, which go as the segment loads them (its pages
  // become resident as used).
  const std::optional<size_t> resident = ReadProcKiB("/proc/self/status", "VmRSS");
  const auto plus_resident = [&resident](std::optional<size_t> bytes) -> std::optional<size_t> {
    if (!bytes) return std::nullopt;
    return *bytes + resident.value_or(0);
  };
  lower(plus_resident(ReadProcKiB("/proc/meminfo", "MemAvailable")), "the machine's available memory");
  // A limit less what the process holds already (the address space counts
  // every mapping: libraries, thread stacks).
  const auto less_used = [](std::optional<size_t> cap, std::optional<size_t> used) -> std::optional<size_t> {
    if (!cap) return std::nullopt;
    return *cap - std::min(*cap, used.value_or(0));
  };
  // cgroup v2: the process's own cgroup ("0::/PATH" in /proc/self/cgroup),
  // else the root of the namespace; v1's memory controller.
  std::string own;
  {
    std::ifstream cgroups("/proc/self/cgroup");
    for (std::string line; std::getline(cgroups, line);) {
      if (line.starts_with("0::")) own = line.substr(3);
    }
  }
  const std::string dir = own.empty() ? std::string("/sys/fs/cgroup") : "/sys/fs/cgroup" + own;
  std::optional<size_t> v2 = ReadLimitFile(dir + "/memory.max");
  std::optional<size_t> v2_used = ReadLimitFile(dir + "/memory.current");
  if (!v2) {
    v2 = ReadLimitFile("/sys/fs/cgroup/memory.max");
    v2_used = ReadLimitFile("/sys/fs/cgroup/memory.current");
  }
  // (The cgroup's usage less this process's resident memory, as above.)
  const auto others = [&resident](std::optional<size_t> used) -> std::optional<size_t> {
    if (!used) return std::nullopt;
    return *used - std::min(*used, resident.value_or(0));
  };
  lower(less_used(v2, others(v2_used)), "what the cgroup's memory.max leaves");
  lower(less_used(ReadLimitFile("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
                  others(ReadLimitFile("/sys/fs/cgroup/memory/memory.usage_in_bytes"))),
        "what the cgroup's memory limit leaves");
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    lower(less_used(rl.rlim_cur, ReadProcKiB("/proc/self/status", "VmSize")), "what ulimit -v leaves");
  }
  if (::getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    lower(less_used(rl.rlim_cur, ReadProcKiB("/proc/self/status", "VmData")), "what ulimit -d leaves");
  }
  return limit;
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

absl::StatusOr<std::shared_ptr<Storage>> Storage::CreateZeroed(const Device& device, size_t bytes) {
  ASSIGN_OR_RETURN(std::shared_ptr<Storage> storage, Create(device, bytes));
  const size_t rounded = (bytes + Allocator::kAlignment - 1) / Allocator::kAlignment * Allocator::kAlignment;
  if (device.type == DeviceType::kCpu && rounded >= CpuAllocator::kMapBytes) return storage;  // mmap's zero pages
  RETURN_IF_ERROR(ZeroBytes(storage->data(), device, bytes));
  return storage;
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
