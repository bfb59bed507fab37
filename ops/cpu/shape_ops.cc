#include "ops/cpu/shape_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/status.h"
#include "ops/cpu/cpu_util.h"

namespace tessera::ops::cpu {
namespace {

// Byte-moving kernels work on unsigned words of the element size, so one
// instantiation serves f32 and i32, bf16 and f16, and so on.
template <typename Fn>
void VisitWord(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 1:
      fn(uint8_t{});
      return;
    case 2:
      fn(uint16_t{});
      return;
    case 4:
      fn(uint32_t{});
      return;
    case 8:
      fn(uint64_t{});
      return;
    default:
      TESSERA_CHECK(false, "no word type of ", bytes, " bytes");
  }
}

template <typename Fn>
void VisitDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      fn(float{});
      return;
    case DType::kF16:
      fn(Half{});
      return;
    case DType::kBF16:
      fn(BFloat16{});
      return;
    case DType::kI32:
      fn(int32_t{});
      return;
    case DType::kI64:
      fn(int64_t{});
      return;
    case DType::kBool:
      fn(bool{});
      return;
    case DType::kF64:
      break;
  }
  TESSERA_CHECK(false, "no kernel handles ", DTypeName(dtype), " (op inference refuses it)");
}

template <typename T>
constexpr bool kIsFloat = std::is_same_v<T, float> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// An element as float (float types) or int64 (integers and bool).
template <typename T>
auto Load(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, Half>) {
    return HalfToFloat(v.bits);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16ToFloat(v.bits);
  } else {
    return static_cast<int64_t>(v);
  }
}

// An integer as a double rounded to odd (exact below 2^53): truncated, with
// the last bit set if anything was cut off, so that one more rounding to a
// 16-bit float gives the integer's own nearest even rounding (two roundings
// to nearest would not; see RoundToOddF32 in core/dtype.cc).
double RoundToOddDouble(int64_t v) {
  const uint64_t magnitude = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  const int cut = std::max(0, static_cast<int>(std::bit_width(magnitude)) - std::numeric_limits<double>::digits);
  uint64_t kept = magnitude >> cut;
  if ((magnitude & ((uint64_t{1} << cut) - 1)) != 0) kept |= 1;
  const double d = std::ldexp(static_cast<double>(kept), cut);
  return v < 0 ? -d : d;
}

// Converts a loaded value (float, or double for arange, or int64) to T per
// Cast's rules, rounding once.
template <typename T, typename V>
T Store(V v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(v);
  } else if constexpr (std::is_same_v<T, Half>) {
    if constexpr (std::is_same_v<V, float>) {
      return Half{FloatToHalf(v)};
    } else if constexpr (std::is_same_v<V, double>) {
      return Half{DoubleToHalf(v)};
    } else {
      return Half{DoubleToHalf(RoundToOddDouble(v))};
    }
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    if constexpr (std::is_same_v<V, float>) {
      return BFloat16{FloatToBFloat16(v)};
    } else if constexpr (std::is_same_v<V, double>) {
      return BFloat16{DoubleToBFloat16(v)};
    } else {
      return BFloat16{DoubleToBFloat16(RoundToOddDouble(v))};
    }
  } else if constexpr (std::is_floating_point_v<V>) {
    // Out-of-range float → int conversion is undefined in C++: saturate.
    const double d = static_cast<double>(v);
    if (std::isnan(d)) return T{0};
    if (d >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    if (d <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
    return static_cast<T>(d);
  } else {
    return static_cast<T>(v);  // integer narrowing wraps (C++20)
  }
}

// `value` as the bit pattern of one element of `dtype`.
uint64_t WordOf(double value, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return std::bit_cast<uint32_t>(static_cast<float>(value));
    case DType::kF16:
      return DoubleToHalf(value);
    case DType::kBF16:
      return DoubleToBFloat16(value);
    case DType::kI32:
      return static_cast<uint32_t>(static_cast<int32_t>(std::llround(value)));
    case DType::kI64:
      return static_cast<uint64_t>(std::llround(value));
    case DType::kBool:
      return value != 0.0 ? 1 : 0;
    case DType::kF64:
      break;
  }
  TESSERA_CHECK(false, "no kernel handles ", DTypeName(dtype), " (op inference refuses it)");
  return 0;
}

// Operands of a broadcasting op iterated together over the output: per
// (coalesced) output axis, each operand's stride in elements, 0 where it
// broadcasts. Operand 0 is the output itself.
struct BroadcastPlan {
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides;  // [operand][axis]
};

BroadcastPlan PlanBroadcast(const Shape& out, const std::vector<Shape>& operands) {
  const int rank = out.rank();
  const size_t num = operands.size();
  std::vector<std::vector<int64_t>> full(num, std::vector<int64_t>(static_cast<size_t>(rank), 0));
  for (size_t k = 0; k < num; ++k) {
    const Shape& s = operands[k];
    const std::vector<int64_t> strides = s.Strides();
    for (int a = 0; a < rank; ++a) {
      const int ia = a - (rank - s.rank());
      if (ia >= 0 && s[ia] != 1) full[k][static_cast<size_t>(a)] = strides[static_cast<size_t>(ia)];
    }
  }
  // Size-1 axes drop out; an axis merges into the one before it when every
  // operand steps over both as one (both broadcast, or both contiguous).
  BroadcastPlan plan;
  plan.strides.resize(num);
  for (int a = 0; a < rank; ++a) {
    if (out[a] == 1) continue;
    bool merge = !plan.dims.empty();
    for (size_t k = 0; k < num && merge; ++k) {
      merge = plan.strides[k].back() == full[k][static_cast<size_t>(a)] * out[a];
    }
    if (merge) {
      plan.dims.back() *= out[a];
      for (size_t k = 0; k < num; ++k) plan.strides[k].back() = full[k][static_cast<size_t>(a)];
    } else {
      plan.dims.push_back(out[a]);
      for (size_t k = 0; k < num; ++k) plan.strides[k].push_back(full[k][static_cast<size_t>(a)]);
    }
  }
  if (plan.dims.empty()) {
    plan.dims.push_back(1);
    for (size_t k = 0; k < num; ++k) plan.strides[k].push_back(0);
  }
  return plan;
}

// Calls fn(offsets, inner_strides, n) for every innermost-axis row of the
// plan: offsets of the row's first element in each operand.
template <size_t N, typename Fn>
void ForEachBroadcastRow(const KernelContext& ctx, const BroadcastPlan& plan, Fn&& fn) {
  const size_t rank = plan.dims.size();
  const int64_t inner = plan.dims.back();
  int64_t rows = 1;
  for (size_t a = 0; a + 1 < rank; ++a) rows *= plan.dims[a];
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = plan.strides[k].back();
  ParallelFor(ctx, rows, RowGrain(inner), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      std::array<int64_t, N> offsets{};
      int64_t rest = row;
      for (size_t a = rank - 1; a-- > 0;) {
        const int64_t i = rest % plan.dims[a];
        rest /= plan.dims[a];
        for (size_t k = 0; k < N; ++k) offsets[k] += i * plan.strides[k][a];
      }
      fn(offsets, inner_strides, inner);
    }
  });
}

// Tile edge of the blocked 2-D transpose: a 32×32 tile of 4-byte words is
// 4 KiB on each side, comfortably in L1.
constexpr int64_t kTile = 32;

template <typename W>
void TransposeWords(const KernelContext& ctx, const W* src, const std::vector<int64_t>& dims,
                    const std::vector<int>& order, W* dst) {
  // dims: coalesced input extents; order[i]: input axis of output axis i.
  const size_t n = dims.size();
  std::vector<int64_t> in_stride(n, 1), out_dims(n), out_stride(n, 1);
  for (size_t a = n - 1; a-- > 0;) in_stride[a] = in_stride[a + 1] * dims[a + 1];
  for (size_t i = 0; i < n; ++i) out_dims[i] = dims[static_cast<size_t>(order[i])];
  for (size_t i = n - 1; i-- > 0;) out_stride[i] = out_stride[i + 1] * out_dims[i + 1];
  int64_t total = 1;
  for (int64_t d : dims) total *= d;

  if (order[n - 1] == static_cast<int>(n - 1)) {
    // The innermost axis stays innermost (e.g. (B, T, H, D) → (B, H, T, D)):
    // contiguous rows of D move whole.
    const int64_t row = dims[n - 1];
    ParallelFor(ctx, total / row, RowGrain(row), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        int64_t in = 0, rest = r;
        for (size_t i = n - 1; i-- > 0;) {
          in += (rest % out_dims[i]) * in_stride[static_cast<size_t>(order[i])];
          rest /= out_dims[i];
        }
        std::memcpy(dst + r * row, src + in, static_cast<size_t>(row) * sizeof(W));
      }
    });
    return;
  }
  // Otherwise a batch of 2-D transposes: output axis j holds the input's
  // innermost axis (C elements), the output's innermost axis is input axis k
  // (M elements); every other axis indexes the batch. Each tile goes through
  // a small buffer so that every cache line of the input and of the output
  // is touched once, whole: with power-of-two row strides, reading a column
  // of lines directly would keep evicting them (they share an L1 set).
  size_t j = 0;
  while (static_cast<size_t>(order[j]) != n - 1) ++j;
  const size_t k = static_cast<size_t>(order[n - 1]);
  const int64_t C = dims[n - 1], M = dims[k];
  const int64_t in_m = in_stride[k], out_c = out_stride[j];
  const int64_t c_tiles = (C + kTile - 1) / kTile;
  const int64_t batch = total / (C * M);
  ParallelFor(ctx, batch * c_tiles, RowGrain(kTile * M), [&](int64_t begin, int64_t end) {
    W tile[kTile][kTile];  // [m - m0][c - c0]
    for (int64_t t = begin; t < end; ++t) {
      int64_t rest = t / c_tiles, in_base = 0, out_base = 0;
      for (size_t i = n - 1; i-- > 0;) {
        if (i == j) continue;
        const int64_t idx = rest % out_dims[i];
        rest /= out_dims[i];
        in_base += idx * in_stride[static_cast<size_t>(order[i])];
        out_base += idx * out_stride[i];
      }
      const int64_t c0 = (t % c_tiles) * kTile, cn = std::min(C - c0, kTile);
      for (int64_t m0 = 0; m0 < M; m0 += kTile) {
        const int64_t mn = std::min(M - m0, kTile);
        for (int64_t m = 0; m < mn; ++m) {
          const W* in = src + in_base + (m0 + m) * in_m + c0;
          for (int64_t c = 0; c < cn; ++c) tile[m][c] = in[c];
        }
        for (int64_t c = 0; c < cn; ++c) {
          W* out = dst + out_base + (c0 + c) * out_c + m0;
          for (int64_t m = 0; m < mn; ++m) out[m] = tile[m][c];
        }
      }
    }
  });
}

}  // namespace

void CopyElements(const KernelContext& ctx, const Tensor& x, const Tensor& y) {
  if (x.raw_data() == y.raw_data()) return;
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(y.raw_data());
  const int64_t bytes = static_cast<int64_t>(y.NumBytes());
  ParallelFor(ctx, bytes, 4 * kElementwiseGrain, [&](int64_t begin, int64_t end) {
    std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin));
  });
}

void ZeroFill(const KernelContext& ctx, const Tensor& y) {
  char* dst = static_cast<char*>(y.raw_data());
  ParallelFor(ctx, static_cast<int64_t>(y.NumBytes()), 4 * kElementwiseGrain,
              [&](int64_t begin, int64_t end) { std::memset(dst + begin, 0, static_cast<size_t>(end - begin)); });
}

uint64_t ElementBits(double value, DType dtype) { return WordOf(value, dtype); }

void FillConstant(const KernelContext& ctx, const Tensor& y, double value) {
  const uint64_t bits = WordOf(value, y.dtype());
  VisitWord(DTypeSize(y.dtype()), [&](auto tag) {
    using W = decltype(tag);
    W* dst = static_cast<W*>(y.raw_data());
    const W word = static_cast<W>(bits);
    ParallelFor(ctx, y.NumElements(), kElementwiseGrain,
                [&](int64_t begin, int64_t end) { std::fill(dst + begin, dst + end, word); });
  });
}

void Arange(const KernelContext& ctx, const Tensor& y, double start, double step, int64_t offset) {
  VisitDType(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* dst = y.data<T>();
    ParallelFor(ctx, y.NumElements(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        // One rounding (an explicit fma, so no compiler choice changes it,
        // and CUDA's kernel computes the same).
        const double v = std::fma(static_cast<double>(offset + i), step, start);
        if constexpr (kIsFloat<T> || std::is_same_v<T, bool>) {
          dst[i] = Store<T>(v);
        } else {
          dst[i] = static_cast<T>(std::llround(v));
        }
      }
    });
  });
}

void BroadcastTo(const KernelContext& ctx, const Tensor& x, const Tensor& y) {
  if (y.NumElements() == 0) return;
  const BroadcastPlan plan = PlanBroadcast(y.shape(), {y.shape(), x.shape()});
  VisitWord(DTypeSize(y.dtype()), [&](auto tag) {
    using W = decltype(tag);
    W* out = static_cast<W*>(y.raw_data());
    const W* in = static_cast<const W*>(x.raw_data());
    ForEachBroadcastRow<2>(ctx, plan,
                           [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& st, int64_t n) {
                             W* o = out + off[0];
                             const W* i = in + off[1];
                             if (st[1] == 0) {
                               std::fill(o, o + n, i[0]);
                             } else {
                               std::memcpy(o, i, static_cast<size_t>(n) * sizeof(W));
                             }
                           });
  });
}

void Transpose(const KernelContext& ctx, const Tensor& x, const std::vector<int>& perm, const Tensor& y) {
  if (y.NumElements() == 0) return;
  const Shape& shape = x.shape();
  // Size-1 axes drop out, and input axes that stay adjacent and in order in
  // the output merge, so e.g. (B, T, H, D) → (B, H, T, D) with B = 1 becomes
  // a 3-D permutation and (0, 1, 2) a plain copy.
  std::vector<int> kept(static_cast<size_t>(shape.rank()), -1);  // input axis → coalesced index before merging
  std::vector<int64_t> dims;
  for (int a = 0; a < shape.rank(); ++a) {
    if (shape[a] != 1) {
      kept[static_cast<size_t>(a)] = static_cast<int>(dims.size());
      dims.push_back(shape[a]);
    }
  }
  std::vector<int> order;
  for (int p : perm) {
    if (kept[static_cast<size_t>(p)] >= 0) order.push_back(kept[static_cast<size_t>(p)]);
  }
  // Merge runs order[i], order[i] + 1, ... into one axis.
  std::vector<std::vector<int>> runs;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && order[i] == order[i - 1] + 1) {
      runs.back().push_back(order[i]);
    } else {
      runs.push_back({order[i]});
    }
  }
  // Merged input axes are the runs sorted by their first input axis.
  std::vector<size_t> by_input(runs.size());
  for (size_t r = 0; r < runs.size(); ++r) by_input[r] = r;
  std::sort(by_input.begin(), by_input.end(), [&](size_t a, size_t b) { return runs[a][0] < runs[b][0]; });
  std::vector<int64_t> merged_dims(runs.size());
  std::vector<int> merged_index(runs.size());
  for (size_t m = 0; m < by_input.size(); ++m) {
    int64_t extent = 1;
    for (int a : runs[by_input[m]]) extent *= dims[static_cast<size_t>(a)];
    merged_dims[m] = extent;
    merged_index[by_input[m]] = static_cast<int>(m);
  }
  if (runs.size() <= 1) {
    CopyElements(ctx, x, y);
    return;
  }
  VisitWord(DTypeSize(x.dtype()), [&](auto tag) {
    using W = decltype(tag);
    TransposeWords<W>(ctx, static_cast<const W*>(x.raw_data()), merged_dims, merged_index,
                      static_cast<W*>(y.raw_data()));
  });
}

void CopyBlockParallel(const KernelContext& ctx, const Tensor& src, const std::vector<int64_t>& src_start,
                       const Tensor& dst, const std::vector<int64_t>& dst_start, const Shape& extent) {
  if (extent.NumElements() == 0) return;
  const size_t elem = DTypeSize(src.dtype());
  const int rank = extent.rank();
  const char* in = static_cast<const char*>(src.raw_data());
  char* out = static_cast<char*>(dst.raw_data());
  if (rank == 0) {
    std::memcpy(out, in, elem);
    return;
  }
  // Trailing axes that the block covers whole in both tensors join the
  // contiguous row moved by one memcpy.
  int k = rank - 1;
  int64_t row = extent[k];
  while (k > 0 && extent[k] == src.shape()[k] && extent[k] == dst.shape()[k]) {
    --k;
    row *= extent[k];
  }
  const std::vector<int64_t> src_stride = src.shape().Strides(), dst_stride = dst.shape().Strides();
  int64_t rows = 1;
  for (int a = 0; a < k; ++a) rows *= extent[a];
  const size_t ku = static_cast<size_t>(k);
  ParallelFor(ctx, rows, RowGrain(row), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t s = src_start[ku] * src_stride[ku], d = dst_start[ku] * dst_stride[ku], rest = r;
      for (int a = k - 1; a >= 0; --a) {
        const size_t au = static_cast<size_t>(a);
        const int64_t i = rest % extent[a];
        rest /= extent[a];
        s += (src_start[au] + i) * src_stride[au];
        d += (dst_start[au] + i) * dst_stride[au];
      }
      std::memcpy(out + static_cast<size_t>(d) * elem, in + static_cast<size_t>(s) * elem,
                  static_cast<size_t>(row) * elem);
    }
  });
}

void WidenTo(const KernelContext& ctx, const Tensor& t, float* out) {
  const auto* bits = static_cast<const uint16_t*>(t.raw_data());
  const bool bf16 = t.dtype() == DType::kBF16;
  ParallelFor(ctx, t.NumElements(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
    if (bf16) {
      for (int64_t i = begin; i < end; ++i) out[i] = BFloat16ToFloat(bits[i]);
      return;
    }
    int64_t i = begin;
#if defined(__AVX512F__)
// GCC 12 warns of an uninitialised pass-through operand inside its own
// _mm512_cvtph_ps (a false positive: the conversion is unmasked).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
    for (; i + 16 <= end; i += 16) {  // vcvtph2ps: exact, subnormals and specials included
      _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i))));
    }
#pragma GCC diagnostic pop
#endif
    for (; i < end; ++i) out[i] = HalfToFloat(bits[i]);
  });
}

void NarrowFrom(const KernelContext& ctx, const float* x, const Tensor& out) {
  auto* bits = static_cast<uint16_t*>(out.raw_data());
  const bool bf16 = out.dtype() == DType::kBF16;
  ParallelFor(ctx, out.NumElements(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
    if (bf16) {
      for (int64_t i = begin; i < end; ++i) bits[i] = FloatToBFloat16(x[i]);
      return;
    }
    int64_t i = begin;
#if defined(__AVX512F__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
    for (; i + 16 <= end; i += 16) {  // vcvtps2ph rounds to nearest even, as FloatToHalf
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#pragma GCC diagnostic pop
#endif
    for (; i < end; ++i) bits[i] = FloatToHalf(x[i]);
  });
}

void Cast(const KernelContext& ctx, const Tensor& x, const Tensor& y) {
  if (x.dtype() == y.dtype()) {
    CopyElements(ctx, x, y);
    return;
  }
  // f32 <-> f16, mixed precision's casts: the CPU's own conversions where it
  // has AVX-512 (WidenTo, NarrowFrom).
  if (x.dtype() == DType::kF32 && y.dtype() == DType::kF16) {
    NarrowFrom(ctx, x.data<float>(), y);
    return;
  }
  if (x.dtype() == DType::kF16 && y.dtype() == DType::kF32) {
    WidenTo(ctx, x, y.data<float>());
    return;
  }
  VisitDType(x.dtype(), [&](auto from_tag) {
    using From = decltype(from_tag);
    VisitDType(y.dtype(), [&](auto to_tag) {
      using To = decltype(to_tag);
      const From* src = x.data<From>();
      To* dst = y.data<To>();
      ParallelFor(ctx, y.NumElements(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = Store<To>(Load(src[i]));
      });
    });
  });
}

void Where(const KernelContext& ctx, const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& out) {
  if (out.NumElements() == 0) return;
  const BroadcastPlan plan = PlanBroadcast(out.shape(), {out.shape(), cond.shape(), x.shape(), y.shape()});
  const bool* c = cond.data<bool>();
  VisitWord(DTypeSize(out.dtype()), [&](auto tag) {
    using W = decltype(tag);
    W* o = static_cast<W*>(out.raw_data());
    const W* a = static_cast<const W*>(x.raw_data());
    const W* b = static_cast<const W*>(y.raw_data());
    ForEachBroadcastRow<4>(ctx, plan,
                           [&](const std::array<int64_t, 4>& off, const std::array<int64_t, 4>& st, int64_t n) {
                             W* orow = o + off[0];
                             const bool* crow = c + off[1];
                             const W* arow = a + off[2];
                             const W* brow = b + off[3];
                             for (int64_t i = 0; i < n; ++i)
                               orow[i] = crow[i * st[1]] ? arow[i * st[2]] : brow[i * st[3]];
                           });
  });
}

void MaskedFill(const KernelContext& ctx, const Tensor& x, const Tensor& mask, double value, const Tensor& y) {
  if (y.NumElements() == 0) return;
  const BroadcastPlan plan = PlanBroadcast(y.shape(), {y.shape(), x.shape(), mask.shape()});
  const bool* m = mask.data<bool>();
  const uint64_t bits = WordOf(value, y.dtype());
  VisitWord(DTypeSize(y.dtype()), [&](auto tag) {
    using W = decltype(tag);
    W* o = static_cast<W*>(y.raw_data());
    const W* in = static_cast<const W*>(x.raw_data());
    const W fill = static_cast<W>(bits);
    ForEachBroadcastRow<3>(ctx, plan,
                           [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st, int64_t n) {
                             W* orow = o + off[0];
                             const W* xrow = in + off[1];
                             const bool* mrow = m + off[2];
                             // x and y share a shape, so x's inner stride is 1 like y's; read
                             // before write keeps in-place (y aliasing x) correct.
                             for (int64_t i = 0; i < n; ++i) orow[i] = mrow[i * st[2]] ? fill : xrow[i];
                           });
  });
}

}  // namespace tessera::ops::cpu
