// CUDA row kernels (softmax family, causal attention softmax, layer norm):
// the math of ops/cpu/norm_softmax.cc, one block per row (grid-stride over
// rows), block-wide reductions in shared memory; the norms' parameter
// gradients as column sums cut into ranges of rows. Launchers: launch.h.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"
#include "ops/reduce_chunks.h"

namespace tessera::ops::cuda {
namespace {

// Sum / max over the block; every thread gets the result. `scratch` holds
// kThreads floats; the call ends with the block synchronised.
__device__ float BlockSum(float v, float* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
    __syncthreads();
  }
  const float out = scratch[0];
  __syncthreads();
  return out;
}

__device__ float BlockMax(float v, float* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + half]);
    __syncthreads();
  }
  const float out = scratch[0];
  __syncthreads();
  return out;
}

// The row's max m and Σ exp(x - m) over the block; every thread gets both.
struct RowStats {
  float max, sumexp;
};
__device__ RowStats MaxSumExp(const float* xr, int64_t C, float* scratch) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < C; j += kThreads) m = fmaxf(m, xr[j]);
  m = BlockMax(m, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < C; j += kThreads) sum += expf(xr[j] - m);
  return {m, BlockSum(sum, scratch)};
}

__global__ void SoftmaxRows(const float* x, float* y, int64_t rows, int64_t C, bool log) {
  __shared__ float scratch[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    const RowStats st = MaxSumExp(xr, C, scratch);
    const float m = st.max, sum = st.sumexp;
    if (log) {
      const float log_sum = logf(sum);  // (x - m) - log Σ, as the CPU kernel
      for (int64_t j = threadIdx.x; j < C; j += kThreads) yr[j] = (xr[j] - m) - log_sum;
    } else {
      const float inv = 1.0f / sum;
      for (int64_t j = threadIdx.x; j < C; j += kThreads) yr[j] = expf(xr[j] - m) * inv;
    }
  }
}

__global__ void SoftmaxGradRows(const float* y, const float* dy, float* dx, int64_t rows, int64_t C, bool log) {
  __shared__ float scratch[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* yr = y + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    float acc = 0.0f;  // Σ y·dy (softmax) or Σ dy (log_softmax)
    for (int64_t j = threadIdx.x; j < C; j += kThreads) acc += log ? dyr[j] : yr[j] * dyr[j];
    acc = BlockSum(acc, scratch);
    for (int64_t j = threadIdx.x; j < C; j += kThreads) {
      dxr[j] = log ? dyr[j] - expf(yr[j]) * acc : yr[j] * (dyr[j] - acc);
    }
  }
}

__global__ void ScaleMaskSoftmaxRows(const float* x, float* y, const uint8_t* mask, AttentionLayout l, int64_t rows,
                                     bool causal, int64_t t_offset, int64_t diagonal, float scale) {
  __shared__ float scratch[kThreads];
  const int64_t S = l.dims[l.rank - 1];
  const int64_t key_stride = l.mask_strides[l.rank - 1];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    // The row's query t and mask row, from its coordinates before S.
    int64_t rest = r, mask_offset = 0, t = 0;
    for (int a = l.rank - 2; a >= 0; --a) {
      const int64_t coord = rest % l.dims[a];
      rest /= l.dims[a];
      mask_offset += coord * l.mask_strides[a];
      if (a == l.rank - 2) t = coord;
    }
    int64_t limit = causal ? t_offset + t + diagonal + 1 : S;  // keys [0, limit) pass the causal test
    limit = limit < 0 ? 0 : (limit > S ? S : limit);
    if (mask != nullptr && key_stride == 0 && mask[mask_offset] == 0) limit = 0;
    const float* xr = x + r * S;
    float* yr = y + r * S;
    const auto kept = [&](int64_t j) {
      return j < limit && (mask == nullptr || key_stride == 0 || mask[mask_offset + j * key_stride] != 0);
    };
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < S; j += kThreads) {
      if (kept(j)) m = fmaxf(m, xr[j] * scale);
    }
    m = BlockMax(m, scratch);
    if (m == -INFINITY) {  // every key dropped
      for (int64_t j = threadIdx.x; j < S; j += kThreads) yr[j] = 0.0f;
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < S; j += kThreads) {
      if (kept(j)) sum += expf(xr[j] * scale - m);
    }
    sum = BlockSum(sum, scratch);
    const float inv = 1.0f / sum;
    // (A dropped key is 0 · inv, as on the CPU: NaN where a NaN logit made
    // the sum NaN.)
    for (int64_t j = threadIdx.x; j < S; j += kThreads) yr[j] = kept(j) ? expf(xr[j] * scale - m) * inv : 0.0f * inv;
  }
}

__global__ void LayerNormRows(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                              int64_t rows, int64_t C, float eps) {
  __shared__ float scratch[kThreads];
  const float inv_c = 1.0f / static_cast<float>(C);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) s += xr[j];
    const float mu = BlockSum(s, scratch) * inv_c;
    float q = 0.0f;  // two passes, as the CPU: no cancellation when |mean| >> std
    for (int64_t j = threadIdx.x; j < C; j += kThreads) q += (xr[j] - mu) * (xr[j] - mu);
    const float rs = 1.0f / sqrtf(BlockSum(q, scratch) * inv_c + eps);
    for (int64_t j = threadIdx.x; j < C; j += kThreads) yr[j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

// dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)), g = dy * gamma.
__global__ void LayerNormGradRows(const float* dy, const float* x, const float* mean, const float* rstd,
                                  const float* gamma, const float* addend, float* dx, int64_t rows, int64_t C) {
  __shared__ float scratch[kThreads];
  const float inv_c = 1.0f / static_cast<float>(C);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * C;
    const float* xr = x + r * C;
    const float mu = mean[r], rs = rstd[r];
    float g = 0.0f, gx = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) {
      g += dyr[j] * gamma[j];
      gx += dyr[j] * gamma[j] * (xr[j] - mu);
    }
    const float mean_g = BlockSum(g, scratch) * inv_c;
    const float mean_gx = BlockSum(gx, scratch) * rs * inv_c;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) {
      const float xhat = (xr[j] - mu) * rs;
      const float d = rs * (dyr[j] * gamma[j] - mean_g - xhat * mean_gx);
      dx[r * C + j] = addend == nullptr ? d : __fadd_rn(d, addend[r * C + j]);  // no FMA with the product
    }
  }
}

__global__ void RmsNormRows(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C,
                            float eps) {
  __shared__ float scratch[kThreads];
  const float inv_c = 1.0f / static_cast<float>(C);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * C;
    float q = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) q += xr[j] * xr[j];
    const float rs = 1.0f / sqrtf(BlockSum(q, scratch) * inv_c + eps);
    for (int64_t j = threadIdx.x; j < C; j += kThreads) y[r * C + j] = xr[j] * rs * gamma[j];
    if (threadIdx.x == 0) rstd[r] = rs;
  }
}

// dx = rstd * (g - xhat * mean_j(g * xhat)), g = dy * gamma, xhat = x * rstd.
__global__ void RmsNormGradRows(const float* dy, const float* x, const float* rstd, const float* gamma, float* dx,
                                int64_t rows, int64_t C) {
  __shared__ float scratch[kThreads];
  const float inv_c = 1.0f / static_cast<float>(C);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * C;
    const float* xr = x + r * C;
    const float rs = rstd[r];
    float gx = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) gx += dyr[j] * gamma[j] * xr[j];
    const float mean_gx = BlockSum(gx, scratch) * rs * inv_c;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) {
      dx[r * C + j] = rs * (dyr[j] * gamma[j] - xr[j] * rs * mean_gx);
    }
  }
}

// A norm's parameter gradients over rows of C: dgamma[j] = Σ_r dy · xhat
// (xhat = (x - mean) · rstd; mean null: RMS norm, xhat = x · rstd) and,
// when dbeta is not null, dbeta[j] = Σ_r dy. The rows are cut into
// `chunks` ranges (ops/reduce_chunks.h: one thread per column over every
// row would leave a GPU nearly idle, 3 blocks for 768 columns). Block (tile,
// range c) takes columns tile * 32 + lane (threadIdx.x % 32), its row lanes
// (threadIdx.x / 32) every kRowLanes-th row of the range, then adds the row
// lanes' sums in lane order: the result when there is one range, else
// double partials [j * chunks + c], dbeta's as columns C + j, for
// CombineChunks. Deterministic: the cut depends on the shape alone.
constexpr int kRowLanes = kThreads / 32;
__global__ void NormParamGrads(const float* dy, const float* x, const float* mean, const float* rstd, float* dgamma,
                               float* dbeta, double* partials, int64_t rows, int64_t C, int64_t chunks) {
  __shared__ float scratch[2][kRowLanes][32];
  const int lane = static_cast<int>(threadIdx.x % 32), row = static_cast<int>(threadIdx.x / 32);
  const int64_t tiles = (C + 31) / 32, length = (rows + chunks - 1) / chunks;
  for (int64_t item = blockIdx.x; item < tiles * chunks; item += gridDim.x) {
    const int64_t j = item / chunks * 32 + lane, c = item % chunks, begin = c * length;
    const int64_t end = begin + length < rows ? begin + length : rows;
    float dg = 0.0f, db = 0.0f;
    if (j < C) {
      for (int64_t r = begin + row; r < end; r += kRowLanes) {
        const float d = dy[r * C + j];
        dg += d * (x[r * C + j] - (mean != nullptr ? mean[r] : 0.0f)) * rstd[r];
        db += d;
      }
    }
    scratch[0][row][lane] = dg;
    scratch[1][row][lane] = db;
    __syncthreads();
    if (row == 0 && j < C) {
      double g = dg, bsum = db;
      for (int i = 1; i < kRowLanes; ++i) {
        g += scratch[0][i][lane];
        bsum += scratch[1][i][lane];
      }
      if (chunks == 1) {
        dgamma[j] = static_cast<float>(g);
        if (dbeta != nullptr) dbeta[j] = static_cast<float>(bsum);
      } else {
        partials[j * chunks + c] = g;
        if (dbeta != nullptr) partials[(C + j) * chunks + c] = bsum;
      }
    }
    __syncthreads();
  }
}

// NormParamGrads, then CombineChunks where the rows took several ranges.
int LaunchNormParamGrads(const float* dy, const float* x, const float* mean, const float* rstd, float* dgamma,
                         float* dbeta, int64_t rows, int64_t C, void* workspace, size_t workspace_bytes) {
  const int64_t chunks = ReduceChunks(rows), outputs = dbeta != nullptr ? 2 * C : C;
  const cudaStream_t stream = CurrentStream();
  PartialsBuffer partials(workspace, workspace_bytes, NormParamGradWorkspaceBytes(rows, C, dbeta != nullptr), stream);
  if (partials.error() != 0) return partials.error();
  const int64_t items = (C + 31) / 32 * chunks;
  NormParamGrads<<<static_cast<unsigned>(items < (1 << 20) ? items : (1 << 20)), kThreads, 0, stream>>>(
      dy, x, mean, rstd, dgamma, dbeta, partials.get(), rows, C, chunks);
  int err = static_cast<int>(cudaGetLastError());
  if (err == 0 && chunks > 1) err = CombineChunks(0, partials.get(), outputs, chunks, 1.0f, dgamma, C, dbeta, stream);
  return err;
}

__global__ void SparseCrossEntropyRows(const float* logits, const int64_t* labels, float* loss, int64_t N,
                                       int64_t V) {
  __shared__ float scratch[kThreads];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = logits + n * V;
    const RowStats st = MaxSumExp(xr, V, scratch);
    if (threadIdx.x == 0) loss[n] = logf(st.sumexp) - (xr[labels[n]] - st.max);
  }
}

__global__ void SparseCrossEntropyGradRows(const float* logits, const int64_t* labels, const float* dloss,
                                           float* dlogits, int64_t N, int64_t V) {
  __shared__ float scratch[kThreads];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = logits + n * V;
    float* dr = dlogits + n * V;
    const RowStats st = MaxSumExp(xr, V, scratch);
    const float scale = dloss[n] / st.sumexp;
    const int64_t label = labels[n];
    for (int64_t j = threadIdx.x; j < V; j += kThreads) {
      dr[j] = expf(xr[j] - st.max) * scale - (j == label ? dloss[n] : 0.0f);
    }
  }
}

unsigned RowBlocks(int64_t rows) { return static_cast<unsigned>(rows < (1 << 20) ? (rows < 1 ? 1 : rows) : (1 << 20)); }

__global__ void CrossEntropyPartialsRows(const float* logits, const float* row_max, const int64_t* labels,
                                         float* sumexp, float* label_logit, int64_t N, int64_t Vs, int64_t offset) {
  __shared__ float scratch[kThreads];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = logits + n * Vs;
    const float m = row_max[n];
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < Vs; j += kThreads) sum += expf(xr[j] - m);
    sum = BlockSum(sum, scratch);
    if (threadIdx.x == 0) {
      sumexp[n] = sum;
      // Only the shard holding the label's column contributes it.
      const int64_t local = labels[n] - offset;
      label_logit[n] = local >= 0 && local < Vs ? xr[local] - m : 0.0f;
    }
  }
}

// f32 `v` as T: itself, or rounded to nearest even (cast's rounding).
template <class T>
__device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    return v;
  }
}

template <class T>
__global__ void CrossEntropyPartialsGradKernel(const float* logits, const float* row_max, const int64_t* labels,
                                               const float* d_sumexp, const float* d_label_logit, T* dlogits, int64_t N,
                                               int64_t Vs, int64_t offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * Vs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / Vs, j = i % Vs;
    float d = d_sumexp[n] * expf(logits[i] - row_max[n]);
    if (labels[n] - offset == j) d += d_label_logit[n];
    dlogits[i] = FromFloat<T>(d);
  }
}

}  // namespace

int LaunchCrossEntropyPartials(const float* logits, const float* row_max, const int64_t* labels, float* sumexp,
                               float* label_logit, int64_t N, int64_t Vs, int64_t offset) {
  if (N == 0) return 0;
  CrossEntropyPartialsRows<<<RowBlocks(N), kThreads, 0, CurrentStream()>>>(logits, row_max, labels, sumexp,
                                                                               label_logit, N, Vs, offset);
  return Finish();
}

namespace {

template <class T>
int LaunchCrossEntropyPartialsGradAs(const float* logits, const float* row_max, const int64_t* labels,
                                     const float* d_sumexp, const float* d_label_logit, T* dlogits, int64_t N,
                                     int64_t Vs, int64_t offset) {
  CrossEntropyPartialsGradKernel<T><<<Blocks(N * Vs), kThreads, 0, CurrentStream()>>>(
      logits, row_max, labels, d_sumexp, d_label_logit, dlogits, N, Vs, offset);
  return Finish();
}

}  // namespace

int LaunchCrossEntropyPartialsGrad(const float* logits, const float* row_max, const int64_t* labels,
                                   const float* d_sumexp, const float* d_label_logit, void* dlogits, int dlogits_dtype,
                                   int64_t N, int64_t Vs, int64_t offset) {
  if (N * Vs == 0) return 0;
  if (dlogits_dtype == 1) {
    return LaunchCrossEntropyPartialsGradAs(logits, row_max, labels, d_sumexp, d_label_logit,
                                            static_cast<__nv_bfloat16*>(dlogits), N, Vs, offset);
  }
  if (dlogits_dtype == 2) {
    return LaunchCrossEntropyPartialsGradAs(logits, row_max, labels, d_sumexp, d_label_logit,
                                            static_cast<__half*>(dlogits), N, Vs, offset);
  }
  return LaunchCrossEntropyPartialsGradAs(logits, row_max, labels, d_sumexp, d_label_logit,
                                          static_cast<float*>(dlogits), N, Vs, offset);
}

int LaunchRmsNorm(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C, float eps) {
  if (rows == 0 || C == 0) return 0;
  RmsNormRows<<<RowBlocks(rows), kThreads, 0, CurrentStream()>>>(x, gamma, y, rstd, rows, C, eps);
  return Finish();
}

int LaunchRmsNormGrad(const float* dy, const float* x, const float* rstd, const float* gamma, float* dx, float* dgamma,
                      int64_t rows, int64_t C, void* workspace, size_t workspace_bytes) {
  if (C == 0) return 0;
  if (rows > 0) RmsNormGradRows<<<RowBlocks(rows), kThreads, 0, CurrentStream()>>>(dy, x, rstd, gamma, dx, rows, C);
  if (const int err = LaunchNormParamGrads(dy, x, nullptr, rstd, dgamma, nullptr, rows, C, workspace, workspace_bytes);
      err != 0) {
    return err;
  }
  return Finish();
}

int LaunchSparseCrossEntropy(const float* logits, const int64_t* labels, float* loss, int64_t N, int64_t V) {
  if (N == 0) return 0;
  SparseCrossEntropyRows<<<RowBlocks(N), kThreads, 0, CurrentStream()>>>(logits, labels, loss, N, V);
  return Finish();
}

int LaunchSparseCrossEntropyGrad(const float* logits, const int64_t* labels, const float* dloss, float* dlogits,
                                 int64_t N, int64_t V) {
  if (N == 0 || V == 0) return 0;
  SparseCrossEntropyGradRows<<<RowBlocks(N), kThreads, 0, CurrentStream()>>>(logits, labels, dloss, dlogits, N, V);
  return Finish();
}

int LaunchSoftmax(const float* x, float* y, int64_t rows, int64_t C, bool log) {
  if (rows == 0 || C == 0) return 0;
  SoftmaxRows<<<RowBlocks(rows), kThreads, 0, CurrentStream()>>>(x, y, rows, C, log);
  return Finish();
}

int LaunchSoftmaxGrad(const float* y, const float* dy, float* dx, int64_t rows, int64_t C, bool log) {
  if (rows == 0 || C == 0) return 0;
  SoftmaxGradRows<<<RowBlocks(rows), kThreads, 0, CurrentStream()>>>(y, dy, dx, rows, C, log);
  return Finish();
}

int LaunchScaleMaskSoftmax(const float* x, float* y, const uint8_t* mask, const AttentionLayout& layout, bool causal,
                           int64_t t_offset, int64_t diagonal, float scale) {
  const int64_t S = layout.dims[layout.rank - 1];
  int64_t n = 1;
  for (int a = 0; a < layout.rank; ++a) n *= layout.dims[a];
  if (n == 0) return 0;
  const int64_t rows = n / S;
  ScaleMaskSoftmaxRows<<<RowBlocks(rows), kThreads, 0, CurrentStream()>>>(x, y, mask, layout, rows, causal,
                                                                              t_offset, diagonal, scale);
  return Finish();
}

int LaunchLayerNorm(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                    int64_t rows, int64_t C, float eps) {
  if (rows == 0 || C == 0) return 0;
  LayerNormRows<<<RowBlocks(rows), kThreads, 0, CurrentStream()>>>(x, gamma, beta, y, mean, rstd, rows, C, eps);
  return Finish();
}

int LaunchLayerNormGrad(const float* dy, const float* x, const float* mean, const float* rstd, const float* gamma,
                        float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C, void* workspace,
                        size_t workspace_bytes, const float* addend) {
  if (C == 0) return 0;
  if (rows > 0) {
    LayerNormGradRows<<<RowBlocks(rows), kThreads, 0, CurrentStream()>>>(dy, x, mean, rstd, gamma, addend, dx, rows, C);
  }
  if (const int err = LaunchNormParamGrads(dy, x, mean, rstd, dgamma, dbeta, rows, C, workspace, workspace_bytes);
      err != 0) {
    return err;
  }
  return Finish();
}

}  // namespace tessera::ops::cuda
