// CUDA cast: every pair of Tessera's dtypes, one kernel instance per pair,
// with ops/cpu/shape_ops.cc's rules (ops/cuda/launch.h LaunchCast); arange,
// which stores its values by the same rules (LaunchArange).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

// An element as float (float types) or int64 (integers and bool).
__device__ inline float Load(float v) { return v; }
__device__ inline float Load(__half v) { return __half2float(v); }
__device__ inline float Load(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline int64_t Load(int32_t v) { return v; }
__device__ inline int64_t Load(int64_t v) { return v; }
__device__ inline int64_t Load(bool v) { return v ? 1 : 0; }

template <typename T, typename V>
__device__ inline T Store(V v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(v);  // int64 -> f32 rounds to nearest even, as on the host
  } else if constexpr (std::is_same_v<T, __half>) {
    if constexpr (std::is_same_v<V, float>) {
      return __float2half_rn(v);
    } else {
      return __ll2half_rn(static_cast<long long>(v));  // one rounding from the integer
    }
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if constexpr (std::is_same_v<V, float>) {
      return __float2bfloat16_rn(v);
    } else {
      return __ll2bfloat16_rn(static_cast<long long>(v));
    }
  } else if constexpr (std::is_same_v<V, float>) {
    // Out-of-range float -> int: saturate; NaN -> 0 (the CPU's rule).
    const double d = static_cast<double>(v);
    if (isnan(d)) return T{0};
    if (d >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    if (d <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
    return static_cast<T>(d);
  } else {
    return static_cast<T>(v);  // integer narrowing wraps
  }
}

template <typename From, typename To>
__global__ void CastKernel(const From* x, To* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = Store<To>(Load(x[i]));
  }
}

template <typename From, typename To>
int Launch(const void* x, void* y, int64_t n) {
  CastKernel<From, To>
      <<<Blocks(n), kThreads, 0, CurrentStream()>>>(static_cast<const From*>(x), static_cast<To*>(y), n);
  return Finish();
}

// Calls fn with a value of the type that `code` names.
template <typename Fn>
int Visit(int code, Fn&& fn) {
  switch (code) {
    case 0:
      return fn(float{});
    case 1:
      return fn(__half{});
    case 2:
      return fn(__nv_bfloat16{});
    case 3:
      return fn(int32_t{});
    case 4:
      return fn(int64_t{});
    case 5:
      return fn(bool{});
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

// A double rounded to float "to odd" (truncated, the last bit set when
// anything was cut off), so one more rounding to a 16-bit float is the
// double's own nearest even rounding (core/dtype.cc's RoundToOddF32).
__device__ inline float RoundToOdd(double v) {
  const float f = __double2float_rz(v);
  if (static_cast<double>(f) == v) return f;
  return __uint_as_float(__float_as_uint(f) | 1u);
}

// An arange value in T as the CPU's Arange stores it: floats rounded once
// to nearest even, integers by llround.
template <typename T>
__device__ inline T StoreArange(double v) {
  if constexpr (std::is_same_v<T, float>) {
    return __double2float_rn(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(RoundToOdd(v));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(RoundToOdd(v));
  } else {
    return static_cast<T>(llround(v));
  }
}

template <typename T>
__global__ void ArangeKernel(T* y, int64_t n, double start, double step, int64_t offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = StoreArange<T>(fma(static_cast<double>(offset + i), step, start));
  }
}

}  // namespace

int LaunchArange(void* y, int dtype, int64_t n, double start, double step, int64_t offset) {
  if (n == 0) return 0;
  return Visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return static_cast<int>(cudaErrorInvalidValue);  // arange has no bool dtype
    } else {
      ArangeKernel<T><<<Blocks(n), kThreads, 0, CurrentStream()>>>(static_cast<T*>(y), n, start, step, offset);
      return Finish();
    }
  });
}

int LaunchCast(const void* x, int from, void* y, int to, int64_t n) {
  if (n == 0) return 0;
  return Visit(from, [&](auto from_tag) {
    return Visit(to, [&](auto to_tag) { return Launch<decltype(from_tag), decltype(to_tag)>(x, y, n); });
  });
}

}  // namespace tessera::ops::cuda
