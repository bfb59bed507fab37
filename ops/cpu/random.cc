// CPU kernels of normal, uniform and dropout.
//
// Every element draws from Philox by its index g in the logical tensor
// (ops/random.cc): block g / 4, lane g % 4. A shard's elements are not one
// range of global indices in general (a split along an inner axis leaves
// gaps), but they are a sequence of runs of consecutive global indices: the
// innermost axes the shard holds whole, together with the first axis it holds
// only part of. Kernels walk those runs and, inside a run, generate whole
// Philox blocks (one call, four elements) in a loop GCC vectorises; only a
// run's ragged ends take a block for fewer than four elements.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/random.h"

#include "core/philox.h"
#include "ops/cpu/cpu_util.h"
#include "ops/cpu/vec_math.h"
#include "ops/random_runs.h"

namespace tessera::ops::cpu {
namespace {

// An element costs several times a plain element-wise one (a Philox block is
// ~40 multiply-adds per four elements), so half the usual chunk already keeps
// a chunk near 10 µs.
constexpr int64_t kRandomGrain = kElementwiseGrain / 2;
constexpr float kTwoPi = 6.28318530717958647692f;
constexpr float kTwoToMinus24 = 1.0f / 16777216.0f;

// The 24 high bits as a float in [0, 2^24). Through int32 because x86 before
// AVX-512 converts only signed integers in vector registers.
inline float High24(uint32_t bits) { return static_cast<float>(static_cast<int32_t>(bits >> 8)); }

// sin(2 pi u) and cos(2 pi u) for u in [0, 1), branch-free: reduce to the
// nearest quarter turn q / 4, evaluate Cephes' minimax polynomials on
// [-pi/4, pi/4], then rotate by q quarter turns. q is rounded by truncation
// (u >= 0) because std::floor keeps GCC 12 from vectorising the block loop.
inline void SinCos2Pi(float u, float* sin_out, float* cos_out) {
  const int32_t q = static_cast<int32_t>(u * 4.0f + 0.5f);       // 0..4
  const float x = (u - static_cast<float>(q) * 0.25f) * kTwoPi;  // [-pi/4, pi/4]
  const float z = x * x;
  const float s = x + x * z * (-1.6666654611e-1f + z * (8.3321608736e-3f + z * -1.9515295891e-4f));
  const float c =
      1.0f - 0.5f * z + z * z * (4.166664568298827e-2f + z * (-1.388731625493765e-3f + z * 2.443315711809948e-5f));
  const int32_t quarter = q & 3;
  const bool swap = (quarter & 1) != 0;
  const float sin_abs = swap ? c : s, cos_abs = swap ? s : c;
  *sin_out = (quarter & 2) != 0 ? -sin_abs : sin_abs;        // quarters 2, 3
  *cos_out = ((quarter + 1) & 2) != 0 ? -cos_abs : cos_abs;  // quarters 1, 2
}

// One tensor's random stream at one step: Philox keyed by the seed, with the
// tensor id and step in the counter's high words.
struct Stream {
  PhiloxKey key;
  uint32_t tensor_id;
  uint32_t step;

  std::array<uint32_t, 4> Block(uint64_t block) const {
    return Philox4x32(key, static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), tensor_id, step);
  }
};

Stream StreamOf(const KernelContext& ctx) {
  return Stream{MakePhiloxKey(static_cast<uint64_t>(ctx.attr().Int("seed"))),
                static_cast<uint32_t>(ctx.attr().Int("tensor_id")), static_cast<uint32_t>(ctx.step)};
}

// Writes the values of global indices [global, global + length) to out, where
// make(words, values) turns one Philox block into the values of its four
// lanes. `make` is taken by value: a local copy of its captures cannot alias
// `out`, so the block loop needs no reloads and vectorises.
template <typename MakeBlock>
void FillRun(const Stream& stream, uint64_t global, int64_t length, MakeBlock make, float* out) {
  float partial[4];
  int64_t done = 0;
  // A head inside a block: the run starts at lane global % 4.
  const int64_t head_lane = static_cast<int64_t>(global % 4);
  if (head_lane != 0) {
    make(stream.Block(global / 4), partial);
    done = std::min<int64_t>(4 - head_lane, length);
    std::memcpy(out, partial + head_lane, static_cast<size_t>(done) * sizeof(float));
  }
  // Whole blocks.
  const uint64_t first_block = (global + static_cast<uint64_t>(done)) / 4;
  const int64_t blocks = (length - done) / 4;
  float* body = out + done;
  for (int64_t k = 0; k < blocks; ++k) make(stream.Block(first_block + static_cast<uint64_t>(k)), body + 4 * k);
  done += 4 * blocks;
  // A tail of fewer than four lanes.
  if (done < length) {
    make(stream.Block(first_block + static_cast<uint64_t>(blocks)), partial);
    std::memcpy(out + done, partial, static_cast<size_t>(length - done) * sizeof(float));
  }
}

// Runs fill(local_begin, global_begin, length) over the output's runs on the
// intra-op threads.
template <typename Fill>
void ForEachLocalRun(const KernelContext& ctx, const TensorSlice& slice, int64_t n, const Fill& fill) {
  if (n == 0) return;
  const GlobalIndexer indexer(slice);
  ParallelFor(ctx, n, kRandomGrain, [&](int64_t begin, int64_t end) { indexer.ForEachRun(begin, end, fill); });
}

// A dropout mask's values from one Philox block: scale where kept, else 0.
struct DropoutMaker {
  int32_t threshold;
  float scale;
  void operator()(const std::array<uint32_t, 4>& w, float* values) const {
    for (int lane = 0; lane < 4; ++lane) {
      values[lane] = static_cast<int32_t>(w[lane] >> 8) >= threshold ? scale : 0.0f;
    }
  }
};

// The dropout op's mask (rate > 0) over the n elements of input 0's shard,
// a piece at a time: fn(local offset of the piece, its mask values, count).
template <typename Fn>
void ForEachMaskPiece(const KernelContext& ctx, double rate, int64_t n, const Fn& fn) {
  const Stream stream = StreamOf(ctx);
  const DropoutMaker make{DropoutThreshold(rate), static_cast<float>(1.0 / (1.0 - rate))};
  constexpr int64_t kPiece = 1024;
  ForEachLocalRun(ctx, ctx.input_slice(0), n, [&](int64_t local, int64_t global, int64_t length) {
    float mask[kPiece];
    for (int64_t start = 0; start < length; start += kPiece) {
      const int64_t count = std::min(kPiece, length - start);
      FillRun(stream, static_cast<uint64_t>(global + start), count, make, mask);
      fn(local + start, mask, count);
    }
  });
}

// y[i] = residual[i] + (x[i] + bias[(c0 + i) % C]) · mask[i] (mask null: 1)
// for i < count: bias_add's, dropout's and add's operations, each rounded on
// its own as the three ops round them. GCC contracts a product and a sum
// into one FMA even across statements under -std=c++20; not here.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
void BiasDropoutAddRun(const float* x, const float* bias, const float* residual, const float* mask, float* y,
                       int64_t count, int64_t c0, int64_t C) {
  int64_t c = c0;
  for (int64_t i = 0; i < count; ++i) {
    float t = x[i] + bias[c];
    if (mask != nullptr) t = t * mask[i];
    y[i] = residual[i] + t;
    if (++c == C) c = 0;
  }
}
#pragma GCC pop_options

}  // namespace

int32_t DropoutThreshold(double rate) { return static_cast<int32_t>(std::ceil(rate * 16777216.0)); }

absl::Status NormalKernel(KernelContext& ctx) {
  const Stream stream = StreamOf(ctx);
  const float mean = static_cast<float>(ctx.attr().Float("mean"));
  const float stddev = static_cast<float>(ctx.attr().Float("std"));
  float* y = ctx.output(0).data<float>();
  // Box–Muller on each pair of words gives two normals (the cos and the sin
  // branch), so one block gives four. u1 = (k + 1) / 2^24 in (0, 1] is
  // core/philox.h's BoxMuller's (its literal 16777217.0f rounds to 2^24);
  // u1 > 0 keeps the log finite.
  const auto make = [mean, stddev](const std::array<uint32_t, 4>& w, float* values) {
    for (int pair = 0; pair < 2; ++pair) {
      const float u1 = (High24(w[2 * pair]) + 1.0f) * kTwoToMinus24;
      const float u2 = High24(w[2 * pair + 1]) * kTwoToMinus24;
      const float radius = stddev * std::sqrt(-2.0f * LogF(u1));
      float sin_t, cos_t;
      SinCos2Pi(u2, &sin_t, &cos_t);
      values[2 * pair] = mean + radius * cos_t;
      values[2 * pair + 1] = mean + radius * sin_t;
    }
  };
  ForEachLocalRun(ctx, ctx.output_slice(0), ctx.output(0).NumElements(),
                  [&](int64_t local, int64_t global, int64_t length) {
                    FillRun(stream, static_cast<uint64_t>(global), length, make, y + local);
                  });
  return absl::OkStatus();
}

absl::Status UniformKernel(KernelContext& ctx) {
  const Stream stream = StreamOf(ctx);
  const float low = static_cast<float>(ctx.attr().Float("low"));
  const float high = static_cast<float>(ctx.attr().Float("high"));
  const float span = high - low;
  // low + span * u can round up to high; the contract is [low, high).
  const float below_high = low < high ? std::nextafter(high, low) : low;
  float* y = ctx.output(0).data<float>();
  const auto make = [low, span, below_high](const std::array<uint32_t, 4>& w, float* values) {
    for (int lane = 0; lane < 4; ++lane) {
      values[lane] = std::min(low + span * (High24(w[lane]) * kTwoToMinus24), below_high);
    }
  };
  ForEachLocalRun(ctx, ctx.output_slice(0), ctx.output(0).NumElements(),
                  [&](int64_t local, int64_t global, int64_t length) {
                    FillRun(stream, static_cast<uint64_t>(global), length, make, y + local);
                  });
  return absl::OkStatus();
}

void DropoutMaskRun(uint64_t seed, uint32_t tensor_id, uint32_t step, int32_t threshold, float scale, uint64_t global,
                    int64_t length, float* out) {
  const Stream stream{MakePhiloxKey(seed), tensor_id, step};
  FillRun(stream, global, length, DropoutMaker{threshold, scale}, out);
}

absl::Status DropoutKernel(KernelContext& ctx) {
  const double rate = ctx.attr().Float("rate");
  const float* x = ctx.input(0).data<float>();
  float* y = ctx.output(0).data<float>();
  const int64_t n = ctx.input(0).NumElements();
  if (rate == 0.0) {
    if (y != x) std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
    return absl::OkStatus();
  }
  // The mask goes through a small buffer rather than y, so y may alias x.
  ForEachMaskPiece(ctx, rate, n, [&](int64_t at, const float* mask, int64_t count) {
    const float* in = x + at;
    float* out = y + at;
    for (int64_t i = 0; i < count; ++i) out[i] = in[i] * mask[i];
  });
  return absl::OkStatus();
}

absl::Status BiasDropoutAddKernel(KernelContext& ctx) {
  const double rate = ctx.attr().Float("rate");
  const Tensor& xt = ctx.input(0);  // (..., C)
  const float* x = xt.data<float>();
  const float* bias = ctx.input(1).data<float>();  // (C,)
  const float* residual = ctx.input(2).data<float>();
  float* y = ctx.output(0).data<float>();
  const int64_t n = xt.NumElements();
  const int64_t C = xt.shape()[xt.shape().rank() - 1];
  if (n == 0) return absl::OkStatus();
  if (rate == 0.0) {
    ParallelFor(ctx, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      BiasDropoutAddRun(x + begin, bias, residual + begin, nullptr, y + begin, end - begin, begin % C, C);
    });
    return absl::OkStatus();
  }
  ForEachMaskPiece(ctx, rate, n, [&](int64_t at, const float* mask, int64_t count) {
    BiasDropoutAddRun(x + at, bias, residual + at, mask, y + at, count, at % C, C);
  });
  return absl::OkStatus();
}

}  // namespace tessera::ops::cpu
