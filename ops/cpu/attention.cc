// Fused attention on the CPU (ops/cpu/attention.h). Per (batch·head), its
// rows RowStride() apart in either layout (ops/attention_shape.h):
//   forward, per block of kRows queries: for each block of kCols keys up to
//     the causal limit, S = scale · q kᵀ (one GEMM), masked keys -inf, the
//     running row max m and sum l rescaled (online softmax), O = O · e^(m_old
//     - m) + e^(S - m) ⊙ Z v (one GEMM; Z the dropout mask, ops/attention_shape.h,
//     applied after l took the undropped e^(S - m)); then y = O / l and
//     lse = m + log l (a row without keys: y = 0, lse = -inf).
//   backward, per (batch·head), for each query block and each of its key
//     blocks: P = e^(scale · q kᵀ - lse) recomputed, D_t = Σ dy_t ⊙ y_t,
//     dS = P ⊙ (dy vᵀ ⊙ Z - D); dq += scale · dS k, dv += (P ⊙ Z)ᵀ dy,
//     dk += scale · dSᵀ q (five GEMMs per tile). Z is the dropout mask
//     (1 without dropout), drawn again from its Philox counters. A (batch,
//     head) is one piece of work, so no sum is shared between threads and
//     each has one order.

#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "ops/cpu/cpu_util.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/norm_softmax.h"
#include "ops/cpu/random.h"
#include "ops/cpu/shape_ops.h"
#include "ops/cpu/vec_math.h"

namespace tessera::ops {

AttentionShape AttentionShapeOf(const KernelContext& ctx, bool masked) {
  AttentionShape a;
  const Shape& q = ctx.input(0).shape();
  const Shape& k = ctx.input(1).shape();
  a.bthd = ctx.attr().String("layout") == "bthd";
  const int heads = a.bthd ? 2 : 1, rows = a.bthd ? 1 : 2;  // the axes of H and of T (S)
  a.batch = q[0];
  a.heads = q[heads];
  a.queries = q[rows];
  a.head_dim = q[3];
  a.keys = k[rows];
  a.causal = ctx.attr().Bool("causal");
  a.scale = static_cast<float>(ctx.attr().Float("scale"));
  const TensorSlice slice = ctx.input_slice(0);
  a.causal_shift = slice.offset[rows] + a.keys - slice.logical[rows];
  if (masked) a.mask = static_cast<const uint8_t*>(ctx.input(ctx.num_inputs() - 1).raw_data());
  const double rate = ctx.attr().Float("dropout_rate");
  if (rate > 0) {
    a.dropout_rate = static_cast<float>(rate);
    a.dropout_threshold = cpu::DropoutThreshold(rate);
    a.dropout_scale = static_cast<float>(1.0 / (1.0 - rate));
    a.dropout_seed = static_cast<uint64_t>(ctx.attr().Int("seed"));
    a.tensor_id = static_cast<uint32_t>(ctx.attr().Int("tensor_id"));
    a.step = static_cast<uint32_t>(ctx.step);
    a.batch_offset = slice.offset[0];
    a.head_offset = slice.offset[heads];
    a.query_offset = slice.offset[rows];
    a.logical_heads = slice.logical[heads];
    a.logical_queries = slice.logical[rows];
  }
  return a;
}

namespace cpu {
namespace {

constexpr int64_t kRows = 64;  // queries per block
constexpr int64_t kCols = 64;  // keys per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The keys [0, end) that some query of [t0, t0 + rows) may see.
int64_t KeyEnd(const AttentionShape& a, int64_t t0, int64_t rows) {
  if (!a.causal) return a.keys;
  return std::clamp<int64_t>(t0 + rows + a.causal_shift, 0, a.keys);
}

// Row `sr` of scores of query t (local) of batch b against keys [s0, s0 +
// cols): those the query does not see (past the causal limit, masked) set
// to -inf. Branch-free over the row, so the loops vectorise.
void HideKeys(const AttentionShape& a, int64_t b, int64_t t, int64_t s0, int64_t cols, float* sr) {
  int64_t seen = cols;
  if (a.causal) {  // key s is visible when s <= t + causal_shift
    seen = std::clamp<int64_t>(t + a.causal_shift + 1 - s0, 0, cols);
    std::fill(sr + seen, sr + cols, kNegInf);
  }
  if (a.mask != nullptr) {
    const uint8_t* keep = a.mask + b * a.keys + s0;
    for (int64_t j = 0; j < seen; ++j) sr[j] = keep[j] != 0 ? sr[j] : kNegInf;
  }
}

// The dropout mask values of row t (local) of (batch, head) bh for keys
// [s0, s0 + cols), into `z`.
void DropoutRow(const AttentionShape& a, int64_t bh, int64_t t, int64_t s0, int64_t cols, float* z) {
  const int64_t b = bh / a.heads, h = bh % a.heads;
  DropoutMaskRun(a.dropout_seed, a.tensor_id, a.step, a.dropout_threshold, a.dropout_scale,
                 static_cast<uint64_t>(a.ProbabilityIndex(b, h, t, s0)), cols, z);
}

absl::Status Forward(KernelContext& ctx, const AttentionShape& a, const float* q, const float* k, const float* v,
                     float* y, float* lse) {
  const int64_t T = a.queries, D = a.head_dim, ld = a.RowStride();
  const int64_t blocks = (T + kRows - 1) / kRows;
  FirstError error;
  ParallelFor(ctx, a.batch * a.heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(kRows * kCols));
    std::vector<float> out(static_cast<size_t>(kRows * std::max<int64_t>(D, 1)));
    std::vector<float> row_max(kRows), row_sum(kRows), keep(kCols);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / blocks, t0 = task % blocks * kRows, rows = std::min(kRows, T - t0);
      const int64_t b = bh / a.heads;
      const float* qb = q + a.QueryRow(bh, t0);
      const float* kh = k + a.KeyRow(bh, 0);
      const float* vh = v + a.KeyRow(bh, 0);
      std::fill(out.begin(), out.end(), 0.0f);
      std::fill(row_max.begin(), row_max.end(), kNegInf);
      std::fill(row_sum.begin(), row_sum.end(), 0.0f);
      const int64_t key_end = KeyEnd(a, t0, rows);
      for (int64_t s0 = 0; s0 < key_end; s0 += kCols) {
        const int64_t cols = std::min(kCols, key_end - s0);
        absl::Status status = SgemmOnThisThread(false, true, rows, cols, D, a.scale, qb, ld, kh + s0 * ld, ld, 0.0f,
                                                scores.data(), kCols);
        if (!status.ok()) return error.Note(status);
        for (int64_t i = 0; i < rows; ++i) {
          float* sr = scores.data() + i * kCols;
          HideKeys(a, b, t0 + i, s0, cols, sr);
          const float m_new = std::max(row_max[i], RowMax(sr, cols));
          if (m_new == kNegInf) {  // no visible key yet: this block adds nothing
            std::fill(sr, sr + cols, 0.0f);
            continue;
          }
          const float correction = ExpF(row_max[i] - m_new);  // 0 when the old max is -inf
          const float sum = ExpShiftedRow(sr, m_new, sr, cols);
          if (a.dropout_rate > 0) {  // dropped after the normaliser took them
            DropoutRow(a, bh, t0 + i, s0, cols, keep.data());
            for (int64_t j = 0; j < cols; ++j) sr[j] *= keep[static_cast<size_t>(j)];
          }
          row_sum[i] = row_sum[i] * correction + sum;
          row_max[i] = m_new;
          float* orow = out.data() + i * D;
          for (int64_t d = 0; d < D; ++d) orow[d] *= correction;
        }
        status = SgemmOnThisThread(false, false, rows, D, cols, 1.0f, scores.data(), kCols, vh + s0 * ld, ld, 1.0f,
                                   out.data(), D);
        if (!status.ok()) return error.Note(status);
      }
      for (int64_t i = 0; i < rows; ++i) {
        float* yr = y + a.QueryRow(bh, t0 + i);
        const float l = row_sum[i];
        const float inv = l > 0 ? 1.0f / l : 0.0f;
        for (int64_t d = 0; d < D; ++d) yr[d] = out[static_cast<size_t>(i * D + d)] * inv;
        lse[bh * T + t0 + i] = l > 0 ? row_max[i] + std::log(l) : kNegInf;
      }
    }
  });
  return error.Take();
}

absl::Status Backward(KernelContext& ctx, const AttentionShape& a, const float* q, const float* k, const float* v,
                      const float* y, const float* lse, const float* dy, float* dq, float* dk, float* dv) {
  const int64_t T = a.queries, S = a.keys, D = a.head_dim, ld = a.RowStride();
  FirstError error;
  // One (batch, head) per piece: its dk and dv gather over every query
  // block, in block order.
  ParallelFor(ctx, a.batch * a.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p(static_cast<size_t>(kRows * kCols)), dp(static_cast<size_t>(kRows * kCols));
    std::vector<float> delta(kRows), keep(kCols);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / a.heads;
      for (int64_t t = 0; t < T; ++t) std::fill_n(dq + a.QueryRow(bh, t), D, 0.0f);
      for (int64_t s = 0; s < S; ++s) {
        std::fill_n(dk + a.KeyRow(bh, s), D, 0.0f);
        std::fill_n(dv + a.KeyRow(bh, s), D, 0.0f);
      }
      for (int64_t t0 = 0; t0 < T; t0 += kRows) {
        const int64_t rows = std::min(kRows, T - t0);
        const int64_t row0 = bh * T + t0;  // in lse
        const float* qb = q + a.QueryRow(bh, t0);
        const float* dyb = dy + a.QueryRow(bh, t0);
        const float* yb = y + a.QueryRow(bh, t0);
        float* dqb = dq + a.QueryRow(bh, t0);
        for (int64_t i = 0; i < rows; ++i) {  // D_t = Σ dy ⊙ y
          delta[static_cast<size_t>(i)] = RowDot(dyb + i * ld, yb + i * ld, D);
        }
        const int64_t key_end = KeyEnd(a, t0, rows);
        for (int64_t s0 = 0; s0 < key_end; s0 += kCols) {
          const int64_t cols = std::min(kCols, key_end - s0);
          const float* kb = k + a.KeyRow(bh, s0);
          const float* vb = v + a.KeyRow(bh, s0);
          absl::Status status =
              SgemmOnThisThread(false, true, rows, cols, D, a.scale, qb, ld, kb, ld, 0.0f, p.data(), kCols);
          if (status.ok()) {
            status = SgemmOnThisThread(false, true, rows, cols, D, 1.0f, dyb, ld, vb, ld, 0.0f, dp.data(), kCols);
          }
          if (!status.ok()) return error.Note(status);
          for (int64_t i = 0; i < rows; ++i) {  // P, then dS = P ⊙ (dP ⊙ Z - D) in dp, P ⊙ Z in p
            const float l = lse[row0 + i];
            float* pr = p.data() + i * kCols;
            float* dpr = dp.data() + i * kCols;
            if (l == kNegInf) {  // a query without keys: no probability
              std::fill(pr, pr + cols, 0.0f);
            } else {
              HideKeys(a, b, t0 + i, s0, cols, pr);
              for (int64_t j = 0; j < cols; ++j) pr[j] = ExpF(pr[j] - l);
            }
            if (a.dropout_rate > 0) {
              DropoutRow(a, bh, t0 + i, s0, cols, keep.data());
              for (int64_t j = 0; j < cols; ++j) {
                const float z = keep[static_cast<size_t>(j)];
                dpr[j] = pr[j] * (dpr[j] * z - delta[static_cast<size_t>(i)]);
                pr[j] *= z;
              }
            } else {
              for (int64_t j = 0; j < cols; ++j) dpr[j] = pr[j] * (dpr[j] - delta[static_cast<size_t>(i)]);
            }
          }
          status = SgemmOnThisThread(true, false, cols, D, rows, 1.0f, p.data(), kCols, dyb, ld, 1.0f,
                                     dv + a.KeyRow(bh, s0), ld);
          if (status.ok()) {
            status = SgemmOnThisThread(false, false, rows, D, cols, a.scale, dp.data(), kCols, kb, ld, 1.0f, dqb, ld);
          }
          if (status.ok()) {
            status = SgemmOnThisThread(true, false, cols, D, rows, a.scale, dp.data(), kCols, qb, ld, 1.0f,
                                       dk + a.KeyRow(bh, s0), ld);
          }
          if (!status.ok()) return error.Note(status);
        }
      }
    }
  });
  return error.Take();
}

// Room for `n` floats: the planned workspace when it holds them (the
// schema asks for it with 16-bit inputs, ops/attention.cc), else `own`.
float* Scratch(const KernelContext& ctx, int64_t n, std::unique_ptr<float[]>& own) {
  if (ctx.workspace.defined() && static_cast<int64_t>(ctx.workspace.NumBytes()) >= n * 4) {
    return static_cast<float*>(ctx.workspace.raw_data());
  }
  own.reset(new float[static_cast<size_t>(n)]);  // not zeroed: all written
  return own.get();
}

}  // namespace

// With bf16 / f16 q, k, v the kernels compute in f32 on their values
// (exact), widened into scratch; the gradients are rounded into q's type.
absl::Status FlashAttentionKernel(KernelContext& ctx) {
  const AttentionShape a = AttentionShapeOf(ctx, ctx.num_inputs() == 4);
  float* y = ctx.output(0).data<float>();
  float* lse = ctx.output(1).data<float>();
  if (ctx.input(0).dtype() == DType::kF32) {
    return Forward(ctx, a, ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(), y, lse);
  }
  const int64_t nq = ctx.input(0).NumElements(), nk = ctx.input(1).NumElements();
  std::unique_ptr<float[]> own;
  float* q = Scratch(ctx, nq + 2 * nk, own);
  float* k = q + nq;
  float* v = k + nk;
  WidenTo(ctx, ctx.input(0), q);
  WidenTo(ctx, ctx.input(1), k);
  WidenTo(ctx, ctx.input(2), v);
  return Forward(ctx, a, q, k, v, y, lse);
}

absl::Status FlashAttentionGradKernel(KernelContext& ctx) {
  const AttentionShape a = AttentionShapeOf(ctx, ctx.num_inputs() == 7);
  const float* y = ctx.input(3).data<float>();
  const float* lse = ctx.input(4).data<float>();
  const float* dy = ctx.input(5).data<float>();
  if (ctx.input(0).dtype() == DType::kF32) {
    return Backward(ctx, a, ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(), y, lse,
                    dy, ctx.output(0).data<float>(), ctx.output(1).data<float>(), ctx.output(2).data<float>());
  }
  const int64_t nq = ctx.input(0).NumElements(), nk = ctx.input(1).NumElements();
  std::unique_ptr<float[]> own;
  float* q = Scratch(ctx, 2 * (nq + 2 * nk), own);
  float* k = q + nq;
  float* v = k + nk;
  float* dq = v + nk;
  float* dk = dq + nq;
  float* dv = dk + nk;
  WidenTo(ctx, ctx.input(0), q);
  WidenTo(ctx, ctx.input(1), k);
  WidenTo(ctx, ctx.input(2), v);
  RETURN_IF_ERROR(Backward(ctx, a, q, k, v, y, lse, dy, dq, dk, dv));
  NarrowFrom(ctx, dq, ctx.output(0));
  NarrowFrom(ctx, dk, ctx.output(1));
  NarrowFrom(ctx, dv, ctx.output(2));
  return absl::OkStatus();
}

}  // namespace cpu
}  // namespace tessera::ops
