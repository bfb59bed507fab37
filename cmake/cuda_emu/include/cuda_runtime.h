#pragma once
// Tessera's CUDA emulator: the device side of CUDA C++ as host C++, for the
// .cu files compiled by the host compiler (cmake/cuda_emu/CMakeLists.txt
// rewrites each `kernel<<<grid, block, smem, stream>>>(args)` into
// `::cuda_emu::Bind(kernel, grid, block, smem, stream)(args)` first).
//
// A launch is queued on its stream. It runs its blocks one after another,
// each block's CUDA threads as fibers of the stream's thread that switch at
// __syncthreads and the warp shuffles (kernel.cc); `__shared__` variables
// are function statics (one block of a kernel runs at a time), dynamic
// shared memory is a fresh buffer of exactly the launch's size. Launch
// limits are the GPU's: at most 1024 threads a block, 48 KiB of dynamic
// shared memory unless cudaFuncSetAttribute raised it, grid y and z at most
// 65535.

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numbers>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

// Device code that has an emulated form (ops/cuda/attention_tc.cu's mma)
// tests this.
#define TESSERA_CUDA_EMU 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)

struct uint3 {
  unsigned int x = 0, y = 0, z = 0;
};

// 16 bytes, aligned as CUDA's (vector loads and stores).
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}  // NOLINT: implicit, as CUDA's
};

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

namespace cuda_emu {

struct LaunchShape {
  dim3 grid, block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  const void* kernel = nullptr;
};

// Checks the shape (a bad one is the calling thread's last error, as a
// real launch's) and queues `body` to run for each thread of each block.
void LaunchGrid(const LaunchShape& shape, std::function<void()> body);

// The barriers behind __syncthreads and the shuffles.
void SyncThreads();
void SyncWarp();
// The calling thread's lane in its warp (its linear index in the block mod 32).
int Lane();
// Lane `src` of the calling thread's warp's values `bits` (8 bytes each).
uint64_t WarpExchange(uint64_t bits, int src);
// The tensor cores' mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} as the
// warp's 32 lanes run it together: c (16 x 8, f32) += a (16 x 16) b (16 x 8),
// each lane holding the fragments PTX's "Matrix Fragments for mma.m16n8k16"
// assigns it (a: four registers of two 16-bit values, b: two, c: four
// floats). Products and sums in f32, k in order.
void WarpMma16816(float* c, const uint32_t* a, const uint32_t* b, bool bf16);
// The launch's dynamic shared memory.
void* DynamicShared();
// Ends the calling CUDA thread's kernel with an error (a device assert).
[[noreturn]] void Trap();

template <class... Params>
struct Bound {
  void (*kernel)(Params...);
  LaunchShape shape;

  template <class... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "a kernel launch with the wrong number of arguments");
    // Arguments are copied at launch, converted to the kernel's parameters.
    auto copied = std::tuple<std::decay_t<Params>...>(static_cast<std::decay_t<Params>>(std::forward<Args>(args))...);
    auto* k = kernel;
    LaunchGrid(shape, [k, copied]() { std::apply(k, copied); });
  }
};

template <class... Params>
Bound<Params...> Bind(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes = 0,
                      cudaStream_t stream = nullptr) {
  return Bound<Params...>{kernel,
                          LaunchShape{grid, block, shared_bytes, stream, reinterpret_cast<const void*>(kernel)}};
}

template <class T>
T FromBits(uint64_t bits) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
template <class T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

}  // namespace cuda_emu

inline void __syncthreads() { cuda_emu::SyncThreads(); }
inline void __syncwarp(unsigned int = 0xffffffffu) { cuda_emu::SyncWarp(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __trap() { cuda_emu::Trap(); }

// The shuffles need every lane of the warp (mask 0xffffffff), as Tessera's
// kernels use them; width splits the warp into segments.
template <class T>
T __shfl_sync(unsigned int, T v, int src, int width = warpSize) {
  const int lane = cuda_emu::Lane();
  const int base = lane - lane % width;
  return cuda_emu::FromBits<T>(cuda_emu::WarpExchange(cuda_emu::ToBits(v), base + ((src % width) + width) % width));
}
template <class T>
T __shfl_xor_sync(unsigned int, T v, int mask, int width = warpSize) {
  const int lane = cuda_emu::Lane();
  int src = lane ^ mask;
  if (src / width != lane / width) src = lane;
  return cuda_emu::FromBits<T>(cuda_emu::WarpExchange(cuda_emu::ToBits(v), src));
}
template <class T>
T __shfl_down_sync(unsigned int, T v, unsigned int delta, int width = warpSize) {
  const int lane = cuda_emu::Lane();
  int src = lane + static_cast<int>(delta);
  if (src / width != lane / width) src = lane;
  return cuda_emu::FromBits<T>(cuda_emu::WarpExchange(cuda_emu::ToBits(v), src));
}
template <class T>
T __shfl_up_sync(unsigned int, T v, unsigned int delta, int width = warpSize) {
  const int lane = cuda_emu::Lane();
  int src = lane - static_cast<int>(delta);
  if (src < 0 || src / width != lane / width) src = lane;
  return cuda_emu::FromBits<T>(cuda_emu::WarpExchange(cuda_emu::ToBits(v), src));
}

// Atomics on device memory.
template <class T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}
template <class T>
T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <class T>
T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (v > old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <class T>
T atomicExch(T* p, T v) {
  return std::atomic_ref<T>(*p).exchange(v);
}
template <class T>
T atomicCAS(T* p, T compare, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(compare, v);
  return compare;
}

// CUDA's device math functions that the C++ library lacks under these names.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::max;
using std::min;
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
// Round-to-nearest products and sums that are never contracted into an FMA.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline void sincospif(float x, float* s, float* c) {
  *s = static_cast<float>(std::sin(std::numbers::pi * static_cast<double>(x)));
  *c = static_cast<float>(std::cos(std::numbers::pi * static_cast<double>(x)));
}
inline void sincosf(float x, float* s, float* c) {
  *s = std::sin(x);
  *c = std::cos(x);
}
inline float __uint_as_float(unsigned int u) { return cuda_emu::FromBits<float>(u); }
inline unsigned int __float_as_uint(float f) { return static_cast<unsigned int>(cuda_emu::ToBits(f)); }
inline float __int_as_float(int i) { return cuda_emu::FromBits<float>(static_cast<uint32_t>(i)); }
inline int __float_as_int(float f) { return static_cast<int>(cuda_emu::ToBits(f)); }
inline double __longlong_as_double(long long v) { return cuda_emu::FromBits<double>(static_cast<uint64_t>(v)); }
inline long long __double_as_longlong(double v) { return static_cast<long long>(cuda_emu::ToBits(v)); }
inline float __double2float_rn(double v) { return static_cast<float>(v); }
// Toward zero: the nearest float, stepped back toward zero when it rounded
// away from it.
inline float __double2float_rz(double v) {
  float f = static_cast<float>(v);
  if (std::isfinite(v) && std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  return f;
}
inline int __popc(unsigned int v) { return __builtin_popcount(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(v)); }
inline int __ffs(int v) { return __builtin_ffs(v); }
