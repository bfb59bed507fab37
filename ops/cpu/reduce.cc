#include "ops/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/sbp.h"
#include "ops/cpu/cpu_util.h"

namespace tessera::ops::cpu {
namespace {

// Shape letters used below: a reduction step sees its input as (O, R, I):
// O outer kept elements, R reduced, I inner kept elements.

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The larger, NaN winning (PyTorch's amax; the collectives' partial max):
// std::max keeps its first argument against a NaN, so a NaN would count
// where it came first and be dropped elsewhere, the result depending on
// how the rows were cut.
inline float MaxNan(float a, float b) { return (a > b || a != a) ? a : b; }

// Independent accumulators: float addition is not associative, so GCC only
// vectorises a reduction written as this many separate sums (which also
// halves the rounding error growth of one long running sum).
constexpr int kLanes = 16;

// Output columns per task when reducing over a non-innermost axis: 8 KiB of
// accumulators stay in L1 while the R input rows stream past, and each row
// piece spans more than a page, so hardware prefetch keeps up.
constexpr int64_t kColumnBlock = 2048;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An input element as f32 (exact for every input type).
inline float Widen(float v) { return v; }
inline float Widen(BFloat16 v) { return BFloat16ToFloat(v.bits); }
inline float Widen(Half v) { return HalfToFloat(v.bits); }

// Sums add a block of terms in float, then the blocks' sums in double, in
// block order; the blocks are fixed by the shape alone. Each float sum then
// has few terms, so a long sum (a full reduction of a large tensor, e.g.
// clipping's Σ |g|^p, or a bias gradient over B·T rows) loses no more than a
// short one, and the result is the same bits whatever the thread count
// (so whatever the threads a layout gives each device).
// Row sums (reduced elements contiguous) block kSumBlock elements: each of
// the kLanes float lanes sums at most 256 of them.
constexpr int64_t kSumBlock = 4096;
// Column sums (reduced axis outside kept ones) block kSumRows rows.
constexpr int64_t kSumRows = 256;

// Σ x[0, n), n <= kSumBlock, in float lanes.
template <typename S>
float SumBlock(const S* x, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += Widen(x[i + j]);
  }
  float rest = 0.0f;
  for (; i < n; ++i) rest += Widen(x[i]);
  for (int j = 0; j < kLanes; ++j) rest += lanes[j];
  return rest;
}

// The larger, a NaN skipped (argmax's: the index of the largest number).
inline float MaxSkippingNan(float a, float b) { return b > a ? b : a; }

// The max of x[0, n): NaN winning (reduce_max) or skipped (argmax).
template <typename S, float (*kMax)(float, float) = MaxNan>
float MaxRow(const S* x, int64_t n) {
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, kNegInf);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] = kMax(lanes[j], Widen(x[i + j]));
  }
  float best = kNegInf;
  for (; i < n; ++i) best = kMax(best, Widen(x[i]));
  for (int j = 0; j < kLanes; ++j) best = kMax(best, lanes[j]);
  return best;
}

// out[0, i1 - i0) = reduction over rows [r0, r1) of the (R, I) block at src,
// columns [i0, i1).
template <typename S>
void ReduceBlock(ReduceKind kind, const S* src, int64_t I, int64_t r0, int64_t r1, int64_t i0, int64_t i1, float* out) {
  if (I == 1) {
    out[0] = kind == ReduceKind::kSum ? SumBlock(src + r0, r1 - r0) : MaxRow(src + r0, r1 - r0);
    return;
  }
  const int64_t n = i1 - i0;
  if (r0 == r1) {
    std::fill(out, out + n, kind == ReduceKind::kSum ? 0.0f : kNegInf);
    return;
  }
  std::transform(src + r0 * I + i0, src + r0 * I + i1, out, [](S v) { return Widen(v); });
  int64_t r = r0 + 1;
  // Four rows per pass over the accumulators: a quarter of the load/store
  // traffic on them, four input streams for the prefetcher.
  for (; r + 4 <= r1; r += 4) {
    const S* a = src + r * I + i0;
    const S* b = a + I;
    const S* c = b + I;
    const S* d = c + I;
    if (kind == ReduceKind::kSum) {
      for (int64_t i = 0; i < n; ++i) out[i] += (Widen(a[i]) + Widen(b[i])) + (Widen(c[i]) + Widen(d[i]));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        out[i] = MaxNan(out[i], MaxNan(MaxNan(Widen(a[i]), Widen(b[i])), MaxNan(Widen(c[i]), Widen(d[i]))));
      }
    }
  }
  for (; r < r1; ++r) {
    const S* row = src + r * I + i0;
    if (kind == ReduceKind::kSum) {
      for (int64_t i = 0; i < n; ++i) out[i] += Widen(row[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = MaxNan(out[i], Widen(row[i]));
    }
  }
}

void Scale(float* p, int64_t n, float scale) {
  if (scale == 1.0f) return;
  for (int64_t i = 0; i < n; ++i) p[i] *= scale;
}

// dst (O, I) = scale · Σ over R of src (O, R, I), R in blocks (above): each
// block's float sum into `partial` (blocks, O, I), then the blocks added in
// double in block order.
template <typename S>
void SumOri(const KernelContext& ctx, const S* src, int64_t O, int64_t R, int64_t I, float* dst, float scale) {
  const int64_t rows_per_block = I == 1 ? kSumBlock : kSumRows;
  const int64_t blocks = CeilDiv(R, rows_per_block);
  const int64_t column_blocks = CeilDiv(I, kColumnBlock);
  const int64_t n = O * I;
  const int64_t tasks = blocks * O * column_blocks;
  const int64_t task_elements = std::min(R, rows_per_block) * std::min(I, kColumnBlock);
  // One block: its float sums are the result.
  std::vector<float> partial(blocks > 1 ? static_cast<size_t>(blocks * n) : 0);
  float* const sums = blocks > 1 ? partial.data() : dst;
  ParallelFor(ctx, tasks, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, task_elements)),
              [&](int64_t begin, int64_t end) {
                for (int64_t t = begin; t < end; ++t) {
                  const int64_t b = t / (O * column_blocks), rest = t % (O * column_blocks);
                  const int64_t o = rest / column_blocks;
                  const int64_t i0 = (rest % column_blocks) * kColumnBlock, i1 = std::min(I, i0 + kColumnBlock);
                  const int64_t r0 = b * rows_per_block, r1 = std::min(R, r0 + rows_per_block);
                  float* out = sums + b * n + o * I + i0;
                  ReduceBlock(ReduceKind::kSum, src + o * R * I, I, r0, r1, i0, i1, out);
                  if (blocks == 1) Scale(out, i1 - i0, scale);
                }
              });
  if (blocks == 1) return;
  ParallelFor(ctx, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    std::vector<double> total(static_cast<size_t>(end - begin), 0.0);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* p = partial.data() + b * n + begin;
      for (int64_t j = 0; j < end - begin; ++j) total[static_cast<size_t>(j)] += p[j];
    }
    for (int64_t j = begin; j < end; ++j) dst[j] = static_cast<float>(total[static_cast<size_t>(j - begin)]) * scale;
  });
}

// dst (O, I) = scale · max over R of src (O, R, I). The max is exact, so
// any cut of R gives the same result.
template <typename S>
void MaxOri(const KernelContext& ctx, const S* src, int64_t O, int64_t R, int64_t I, float* dst, float scale) {
  const int64_t column_blocks = CeilDiv(I, kColumnBlock);
  const int64_t tasks = O * column_blocks;
  const int64_t task_elements = R * std::min(I, kColumnBlock);
  // Few tasks but much work (a full reduction, or a leading-axis one over
  // few columns): cut R into chunks reduced separately, then combine.
  int64_t chunks = 1;
  if (tasks < ctx.num_threads()) {
    chunks = std::min({R, CeilDiv(ctx.num_threads(), tasks), std::max<int64_t>(1, O * R * I / kElementwiseGrain)});
  }
  if (chunks == 1) {
    ParallelFor(ctx, tasks, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, task_elements)),
                [&](int64_t begin, int64_t end) {
                  for (int64_t t = begin; t < end; ++t) {
                    const int64_t o = t / column_blocks;
                    const int64_t i0 = (t % column_blocks) * kColumnBlock, i1 = std::min(I, i0 + kColumnBlock);
                    float* out = dst + o * I + i0;
                    ReduceBlock(ReduceKind::kMax, src + o * R * I, I, 0, R, i0, i1, out);
                    Scale(out, i1 - i0, scale);
                  }
                });
    return;
  }
  std::vector<float> partial(static_cast<size_t>(chunks * O * I));  // (chunks, O, I)
  ParallelFor(ctx, chunks * tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t c = t / tasks, rest = t % tasks;
      const int64_t o = rest / column_blocks;
      const int64_t i0 = (rest % column_blocks) * kColumnBlock, i1 = std::min(I, i0 + kColumnBlock);
      const Range rows = BalancedSplit(R, chunks, c);
      ReduceBlock(ReduceKind::kMax, src + o * R * I, I, rows.offset, rows.offset + rows.size, i0, i1,
                  partial.data() + (c * O + o) * I + i0);
    }
  });
  const int64_t n = O * I;
  ParallelFor(ctx, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    std::copy(partial.data() + begin, partial.data() + end, dst + begin);
    for (int64_t c = 1; c < chunks; ++c) {
      const float* part = partial.data() + c * n;
      for (int64_t j = begin; j < end; ++j) dst[j] = MaxNan(dst[j], part[j]);
    }
    Scale(dst + begin, end - begin, scale);
  });
}

// dst (O, I) = scale · reduce over R (> 0) of src (O, R, I).
template <typename S>
void ReduceOri(const KernelContext& ctx, ReduceKind kind, const S* src, int64_t O, int64_t R, int64_t I, float* dst,
               float scale) {
  if (kind == ReduceKind::kSum) {
    SumOri(ctx, src, O, R, I, dst, scale);
  } else {
    MaxOri(ctx, src, O, R, I, dst, scale);
  }
}

// Runs of axes with the same reduced/kept status merge into one group, and
// size-1 axes drop out, so any reduction becomes a few (O, R, I) steps.
struct Group {
  int64_t extent;
  bool reduced;
};

std::vector<Group> Coalesce(const Shape& shape, const std::vector<bool>& reduced) {
  std::vector<Group> groups;
  for (int a = 0; a < shape.rank(); ++a) {
    if (shape[a] == 1) continue;
    const bool r = reduced[static_cast<size_t>(a)];
    if (!groups.empty() && groups.back().reduced == r) {
      groups.back().extent *= shape[a];
    } else {
      groups.push_back({shape[a], r});
    }
  }
  if (groups.empty()) groups.push_back({1, false});
  return groups;
}

// y = scale · reduce of src (x's shape coalesced into `groups`): reduced
// groups go innermost first, the first step reading src (f32, bf16 or
// f16, widened exactly as it is read), the later ones its f32 result.
template <typename S>
void ReduceGroups(const KernelContext& ctx, ReduceKind kind, const S* src, std::vector<Group> groups, float scale,
                  float* out, int64_t n_out) {
  const int j = [&] {
    int g = static_cast<int>(groups.size()) - 1;
    while (g >= 0 && !groups[static_cast<size_t>(g)].reduced) --g;
    return g;
  }();
  if (j < 0) {  // nothing (left) to reduce over: a scaled copy
    ParallelFor(ctx, n_out, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = Widen(src[i]) * scale;
    });
    return;
  }
  int64_t O = 1, I = 1;
  bool last = true;
  for (int g = 0; g < j; ++g) {
    O *= groups[static_cast<size_t>(g)].extent;
    if (groups[static_cast<size_t>(g)].reduced) last = false;
  }
  for (size_t g = static_cast<size_t>(j) + 1; g < groups.size(); ++g) I *= groups[g].extent;
  const int64_t R = groups[static_cast<size_t>(j)].extent;
  if (last) {
    ReduceOri(ctx, kind, src, O, R, I, out, scale);
    return;
  }
  std::vector<float> step(static_cast<size_t>(O * I));
  ReduceOri(ctx, kind, src, O, R, I, step.data(), 1.0f);
  groups.erase(groups.begin() + j);
  ReduceGroups(ctx, kind, step.data(), std::move(groups), scale, out, n_out);
}

}  // namespace

void Reduce(const KernelContext& ctx, ReduceKind kind, const Tensor& x, const std::vector<bool>& reduced, float scale,
            const Tensor& y) {
  float* out = y.data<float>();
  const int64_t n_out = y.NumElements();
  if (n_out == 0) return;
  if (x.NumElements() == 0) {
    // Scaled too, so an empty mean is NaN (0 · 1/0) as in numpy.
    std::fill(out, out + n_out, kind == ReduceKind::kSum ? 0.0f * scale : kNegInf);
    return;
  }
  std::vector<Group> groups = Coalesce(x.shape(), reduced);
  switch (x.dtype()) {
    case DType::kBF16:
      ReduceGroups(ctx, kind, x.data<BFloat16>(), std::move(groups), scale, out, n_out);
      return;
    case DType::kF16:
      ReduceGroups(ctx, kind, x.data<Half>(), std::move(groups), scale, out, n_out);
      return;
    default:
      ReduceGroups(ctx, kind, x.data<float>(), std::move(groups), scale, out, n_out);
  }
}

void ReduceMaxGrad(const KernelContext& ctx, const Tensor& x, const std::vector<bool>& reduced, const Tensor& y,
                   const Tensor& dy, const Tensor& dx) {
  float* grad = dx.data<float>();
  if (dx.NumElements() == 0) return;
  const float* xs = x.data<float>();
  const float* ys = y.data<float>();
  const float* dys = dy.data<float>();
  const std::vector<Group> groups = Coalesce(x.shape(), reduced);
  const size_t num_groups = groups.size();
  // Output stride of each group (0 for reduced ones) and input elements
  // under one index of each group.
  std::vector<int64_t> out_stride(num_groups, 0), in_inner(num_groups, 1);
  int64_t stride = 1;
  for (size_t g = num_groups; g-- > 0;) {
    if (!groups[g].reduced) {
      out_stride[g] = stride;
      stride *= groups[g].extent;
    }
    if (g + 1 < num_groups) in_inner[g] = in_inner[g + 1] * groups[g + 1].extent;
  }
  std::vector<float> ties(static_cast<size_t>(y.NumElements()), 0.0f);
  // Calls fn(in_offset, out_offset, out_step, n) for every run of the
  // innermost group under first-group indices [begin, end).
  auto for_each_run = [&](int64_t begin, int64_t end, auto&& fn) {
    if (num_groups == 1) {
      fn(begin, begin * out_stride[0], out_stride[0], end - begin);
      return;
    }
    const Group& inner = groups.back();
    const int64_t runs = in_inner[0] / inner.extent;  // runs under one first-group index
    for (int64_t g0 = begin; g0 < end; ++g0) {
      for (int64_t run = 0; run < runs; ++run) {
        int64_t in = g0 * in_inner[0] + run * inner.extent, out = g0 * out_stride[0];
        int64_t rest = run;
        for (size_t g = num_groups - 1; g-- > 1;) {
          out += (rest % groups[g].extent) * out_stride[g];
          rest /= groups[g].extent;
        }
        fn(in, out, out_stride.back(), inner.extent);
      }
    }
  };
  auto count = [&](int64_t begin, int64_t end) {
    for_each_run(begin, end, [&](int64_t in, int64_t out, int64_t step, int64_t n) {
      for (int64_t i = 0; i < n; ++i) ties[static_cast<size_t>(out + i * step)] += xs[in + i] == ys[out + i * step];
    });
  };
  auto route = [&](int64_t begin, int64_t end) {
    for_each_run(begin, end, [&](int64_t in, int64_t out, int64_t step, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t o = out + i * step;
        // A NaN maximum ties with nothing: its whole slice's gradient is
        // NaN, as PyTorch's amax's (mask * dy / 0).
        grad[in + i] = xs[in + i] == ys[o] ? dys[o] / ties[static_cast<size_t>(o)]
                       : std::isnan(ys[o]) ? std::numeric_limits<float>::quiet_NaN()
                                           : 0.0f;
      }
    });
  };
  // Tasks over the first group own disjoint outputs only when it is kept;
  // a leading reduced group makes every task touch every tie counter, so
  // that (rare for gradients) layout runs on one thread.
  const int64_t first = groups[0].extent;
  if (groups[0].reduced) {
    count(0, first);
    route(0, first);
    return;
  }
  const int64_t grain = RowGrain(in_inner[0]);
  ParallelFor(ctx, first, grain, count);
  ParallelFor(ctx, first, grain, route);
}

void Argmax(const KernelContext& ctx, const Tensor& x, int axis, const Tensor& y) {
  const Shape& shape = x.shape();
  int64_t O = 1, I = 1;
  for (int a = 0; a < axis; ++a) O *= shape[a];
  for (int a = axis + 1; a < shape.rank(); ++a) I *= shape[a];
  const int64_t N = shape[axis];
  const float* src = x.data<float>();
  int64_t* out = y.data<int64_t>();
  if (y.NumElements() == 0) return;
  if (I == 1) {
    // Contiguous rows: a vectorised max, then the first position holding it.
    ParallelFor(ctx, O, RowGrain(N), [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        const float* row = src + o * N;
        const float best = MaxRow<float, MaxSkippingNan>(row, N);
        int64_t n = 0;
        while (n < N && row[n] != best) ++n;
        out[o] = n == N ? 0 : n;  // no match: an all-NaN row
      }
    });
    return;
  }
  ParallelFor(ctx, O, RowGrain(N * I), [&](int64_t begin, int64_t end) {
    std::vector<float> best(static_cast<size_t>(I));
    for (int64_t o = begin; o < end; ++o) {
      const float* block = src + o * N * I;  // (N, I)
      int64_t* idx = out + o * I;            // (I)
      // NaN until the column's first number (NaN is skipped, as in the
      // rows above: a column of NaN gives 0, one of -inf its first).
      std::fill(best.begin(), best.end(), std::numeric_limits<float>::quiet_NaN());
      std::fill(idx, idx + I, 0);
      // Strictly greater: the first maximum wins ties.
      for (int64_t n = 0; n < N; ++n) {
        const float* row = block + n * I;
        for (int64_t i = 0; i < I; ++i) {
          const float b = best[static_cast<size_t>(i)];
          const bool better = row[i] > b || (b != b && row[i] == row[i]);
          best[static_cast<size_t>(i)] = better ? row[i] : best[static_cast<size_t>(i)];
          idx[i] = better ? n : idx[i];
        }
      }
    }
  });
}

void TopK(const KernelContext& ctx, const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  const int64_t N = x.shape().rank() == 0 ? 1 : x.shape()[x.shape().rank() - 1];
  const int64_t rows = N == 0 ? 0 : x.NumElements() / N;
  const float* src = x.data<float>();
  float* vals = values.data<float>();
  int64_t* idxs = indices.data<int64_t>();
  if (k == 0 || rows == 0) return;
  ParallelFor(ctx, rows, RowGrain(N * 4), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> order(static_cast<size_t>(N));
    for (int64_t r = begin; r < end; ++r) {
      const float* row = src + r * N;
      std::iota(order.begin(), order.end(), 0);
      // Descending by value, ties by lower index; NaN sorts last so the
      // comparison stays a strict weak order.
      auto before = [row](int64_t a, int64_t b) {
        const float va = row[a], vb = row[b];
        const bool na = std::isnan(va), nb = std::isnan(vb);
        if (na || nb) return na == nb ? a < b : nb;
        return va > vb || (va == vb && a < b);
      };
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      for (int64_t j = 0; j < k; ++j) {
        idxs[r * k + j] = order[static_cast<size_t>(j)];
        vals[r * k + j] = row[order[static_cast<size_t>(j)]];
      }
    }
  });
}

void SquareSum(const KernelContext& ctx, const Tensor& x, const Tensor& y) {
  const float* src = x.data<float>();
  const int64_t n = x.NumElements();
  // The cut depends on the count alone (it followed the device's threads:
  // a norm's bits, so a clipped run's, changed from one machine to another).
  const int64_t chunks = std::clamp<int64_t>(n / kElementwiseGrain, 1, 256);
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  ParallelFor(ctx, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const Range range = BalancedSplit(n, chunks, c);
      const float* p = src + range.offset;
      // Double lanes, as the CUDA kernel's double accumulator: float lanes
      // summing a large gradient's ~10^5 squares each lost 1e-4 of its
      // square sum (the 2-norm clipping scales by and reports), and the loss
      // changed with the chunking, so with the threads of a device.
      double lanes[kLanes] = {};
      int64_t i = 0;
      for (; i + kLanes <= range.size; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) lanes[j] += static_cast<double>(p[i + j]) * p[i + j];
      }
      double total = 0.0;
      for (; i < range.size; ++i) total += static_cast<double>(p[i]) * p[i];
      for (int j = 0; j < kLanes; ++j) total += lanes[j];
      partial[static_cast<size_t>(c)] = total;
    }
  });
  double total = 0.0;
  for (double part : partial) total += part;
  y.data<float>()[0] = static_cast<float>(total);
}

}  // namespace tessera::ops::cpu
