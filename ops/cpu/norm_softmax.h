#pragma once
// CPU kernels of the normalisation and softmax family (schemas in
// ops/norm_softmax.cc), and the row reductions they share with the
// cross-entropy kernels (ops/cpu/loss.cc).
//
// Every op here normalises over the last axis: a tensor of shape (..., C) is
// R = numel / C rows of C contiguous floats. Kernels run rows in parallel;
// each row is small enough to stay in L1/L2 between its passes, so a kernel
// costs one read of its inputs and one write of its outputs from memory.

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "ops/cpu/vec_math.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cpu {

// Independent partial results per row reduction. GCC keeps float additions
// in source order (no -ffast-math), so `sum += x[j]` stays scalar; 16
// explicit accumulators let it use one AVX-512 register (two AVX2 ones). The
// lane loop is kept a loop (unroll 1) so the loop vectoriser turns it into
// vector ops; fully unrolled, the basic-block vectoriser gives up on selects
// (max) and on ExpF.
inline constexpr int kReduceLanes = 16;

// Σ_{j<n} term(j), summed in kReduceLanes interleaved partial sums.
template <typename Term>
inline float LaneSum(int64_t n, Term term) {
  float acc[kReduceLanes] = {};
  int64_t j = 0;
  for (; j + kReduceLanes <= n; j += kReduceLanes) {
#pragma GCC unroll 1
    for (int l = 0; l < kReduceLanes; ++l) acc[l] += term(j + l);
  }
  float s = 0.0f;
  for (; j < n; ++j) s += term(j);
  for (int l = 0; l < kReduceLanes; ++l) s += acc[l];
  return s;
}

// max_j x[j]; -inf for an empty row.
inline float RowMax(const float* x, int64_t n) {
  float acc[kReduceLanes];
  for (int l = 0; l < kReduceLanes; ++l) acc[l] = -INFINITY;
  int64_t j = 0;
  for (; j + kReduceLanes <= n; j += kReduceLanes) {
#pragma GCC unroll 1
    for (int l = 0; l < kReduceLanes; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  }
  float m = -INFINITY;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  for (int l = 0; l < kReduceLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

inline float RowSum(const float* x, int64_t n) {
  return LaneSum(n, [x](int64_t j) { return x[j]; });
}

inline float RowDot(const float* x, const float* y, int64_t n) {
  return LaneSum(n, [x, y](int64_t j) { return x[j] * y[j]; });
}

// y[j] = exp(x[j] - shift), returning Σ_j y[j]: one pass instead of two.
// `y` may be `x`.
inline float ExpShiftedRow(const float* x, float shift, float* y, int64_t n) {
  return LaneSum(n, [x, shift, y](int64_t j) {
    const float e = ExpF(x[j] - shift);
    y[j] = e;
    return e;
  });
}

// Σ_j exp(x[j] - shift), without storing the exponentials.
inline float RowSumExp(const float* x, float shift, int64_t n) {
  return LaneSum(n, [x, shift](int64_t j) { return ExpF(x[j] - shift); });
}

// softmax(x) / log_softmax(x) over the last axis.
absl::Status SoftmaxKernel(KernelContext& ctx);
absl::Status LogSoftmaxKernel(KernelContext& ctx);
// (y, dy) -> dx.
absl::Status SoftmaxGradKernel(KernelContext& ctx);
absl::Status LogSoftmaxGradKernel(KernelContext& ctx);
// (x, mask) -> y, and (x) -> y with the causal mask only.
absl::Status FusedScaleMaskSoftmaxKernel(KernelContext& ctx);
absl::Status FusedScaleCausalSoftmaxKernel(KernelContext& ctx);
// (x, gamma, beta) -> (y, mean, rstd) and (dy, x, mean, rstd, gamma) -> (dx, dgamma, dbeta).
absl::Status LayerNormKernel(KernelContext& ctx);
// Rows of each block of a norm's parameter-gradient sums (dgamma, dbeta):
// each block sums its rows in float into a scratch row of its own, then the
// blocks are added in double, in block order, so the sums do not depend on
// the thread count.
inline constexpr int64_t kNormRowBlock = 64;
inline int64_t NormRowBlocks(int64_t rows) {
  return rows <= kNormRowBlock ? 1 : (rows + kNormRowBlock - 1) / kNormRowBlock;
}
// Bytes of those scratch rows over `rows` rows of C columns (dgamma's, and
// dbeta's `with_bias`): the kernels' workspace.
inline int64_t NormParamGradScratchBytes(int64_t rows, int64_t C, bool with_bias) {
  return NormRowBlocks(rows) * (with_bias ? 2 : 1) * C * static_cast<int64_t>(sizeof(float));
}
absl::Status LayerNormGradKernel(KernelContext& ctx);
// (x, gamma) -> (y, rstd) and (dy, x, rstd, gamma) -> (dx, dgamma).
absl::Status RmsNormKernel(KernelContext& ctx);
absl::Status RmsNormGradKernel(KernelContext& ctx);

}  // namespace tessera::ops::cpu
