#pragma once
// What the communicators share (internal to comm/collective): the reduction
// kernels that define the numerics of every reduction (shm_communicator.h:
// 16-bit floats accumulate in f32 and round once on store, integers wrap,
// max propagates NaN, ranks combined strictly in order 0, 1, ..., p-1 — so
// shared-memory and gloo results are bit-identical), the collectives' numbering,
// and small buffer helpers.

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "comm/collective/communicator.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace tessera::comm::internal {

// Accumulation type and conversions per element type.
template <typename T>
struct Accum {
  using Type = T;
  static Type Load(T v) { return v; }
  static T Store(Type v) { return v; }
};
template <>
struct Accum<Half> {
  using Type = float;
  static float Load(Half v) { return HalfToFloat(v.bits); }
  static Half Store(float v) { return Half{FloatToHalf(v)}; }
};
template <>
struct Accum<BFloat16> {
  using Type = float;
  static float Load(BFloat16 v) { return BFloat16ToFloat(v.bits); }
  static BFloat16 Store(float v) { return BFloat16{FloatToBFloat16(v)}; }
};

template <ReduceOp kOp, typename A>
inline A Combine(A acc, A x) {
  if constexpr (kOp == ReduceOp::kSum) {
    if constexpr (std::is_integral_v<A>) {
      // Wrap on overflow (two's complement) instead of signed-overflow UB.
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(acc) + static_cast<U>(x));
    } else {
      return acc + x;
    }
  } else {
    if constexpr (std::is_integral_v<A>) {
      return std::max(acc, x);
    } else {
      return (x > acc || x != x) ? x : acc;  // NaN wins
    }
  }
}

// outputs[o][i] = inputs[0][i] (+) inputs[1][i] (+) ... for i in [begin, end),
// ranks combined strictly in order. Each block is read from every input before
// any output is written, so an output may be the same buffer as an input.
template <typename T, ReduceOp kOp>
void ReduceRange(const std::vector<const void*>& inputs, const std::vector<void*>& outputs, int64_t begin,
                 int64_t end) {
  using A = typename Accum<T>::Type;
  constexpr int64_t kBlock = 256;
  A acc[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    const T* x0 = static_cast<const T*>(inputs[0]) + b;
    for (int64_t i = 0; i < n; ++i) acc[i] = Accum<T>::Load(x0[i]);
    for (size_t r = 1; r < inputs.size(); ++r) {
      const T* x = static_cast<const T*>(inputs[r]) + b;
      for (int64_t i = 0; i < n; ++i) acc[i] = Combine<kOp>(acc[i], Accum<T>::Load(x[i]));
    }
    for (void* out : outputs) {
      T* y = static_cast<T*>(out) + b;
      for (int64_t i = 0; i < n; ++i) y[i] = Accum<T>::Store(acc[i]);
    }
  }
}

using ReduceFn = void (*)(const std::vector<const void*>&, const std::vector<void*>&, int64_t, int64_t);

template <typename T>
ReduceFn PickReduce(ReduceOp op) {
  return op == ReduceOp::kSum ? &ReduceRange<T, ReduceOp::kSum> : &ReduceRange<T, ReduceOp::kMax>;
}

// The kernel for a reducible dtype (Reducible); CHECKed.
inline ReduceFn ReduceFor(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF32: return PickReduce<float>(op);
    case DType::kF16: return PickReduce<Half>(op);
    case DType::kBF16: return PickReduce<BFloat16>(op);
    case DType::kI32: return PickReduce<int32_t>(op);
    case DType::kI64: return PickReduce<int64_t>(op);
    case DType::kBool: case DType::kF64: break;
  }
  TESSERA_CHECK(false, "no reduction for dtype ", DTypeName(dtype));
  return nullptr;
}

// The collectives, numbered as the communicators' descriptors carry them.
enum class Kind : int64_t { kAllReduce = 1, kAllGather, kReduceScatter, kAllToAll, kBroadcast };

inline const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "AllReduce";
    case Kind::kAllGather: return "AllGather";
    case Kind::kReduceScatter: return "ReduceScatter";
    case Kind::kAllToAll: return "AllToAll";
    case Kind::kBroadcast: return "Broadcast";
  }
  return "?";
}

// f64 has no kernels anywhere (core/dtype.h), reductions included.
inline bool Reducible(DType dtype) { return dtype != DType::kBool && dtype != DType::kF64; }

// offsets[i] = counts[0] + ... + counts[i-1]; offsets[p] = the total.
inline std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

inline char* BytePtr(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

// Whether two tensors' bytes overlap (empty tensors overlap nothing).
inline bool Overlap(const Tensor& a, const Tensor& b) {
  const char* pa = BytePtr(a);
  const char* pb = BytePtr(b);
  return a.NumBytes() > 0 && b.NumBytes() > 0 && pa < pb + b.NumBytes() && pb < pa + a.NumBytes();
}

}  // namespace tessera::comm::internal
