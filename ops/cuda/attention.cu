// Fused attention kernels (launch.h: LaunchFlashAttention,
// LaunchFlashAttentionGrad). Blocks of kWarps warps, one warp per row:
//   forward: a query row; tiles of kTile keys (k, v) in shared memory; lane
//     j scores key j of the tile, the warp keeps the running max and sum
//     (online softmax) and accumulates p · v with lane d holding output
//     dims d, d + 32, ... (head dim <= 128: four per lane).
//   backward 1: a query row: delta = Σ dy ⊙ y (kept in the workspace), then
//     dq = scale Σ_s P (dy · v_s Z - delta) k_s over the key tiles.
//   backward 2: a key row: over tiles of kTile queries (q, dy, lse, delta in
//     shared memory), dv = Σ_t P Z dy_t and dk = scale Σ_t P (dy_t · v Z -
//     delta_t) q_t.
// Z is the dropout mask (ops/attention_shape.h; 1 without dropout): each
// lane draws its element's Philox block, as the dropout op's kernel does.
// Shared tiles are rows of D + 1 floats, so lanes reading one column of
// different rows hit different banks. Rows of q, k, v, y and their
// gradients are RowStride() apart in global memory (either layout).

#include <cuda_runtime.h>

#include <cmath>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

using attention::Keep;
using attention::KeyEnd;
using attention::Visible;
using attention::WarpMax;
using attention::WarpSum;

constexpr int kWarps = 4;
constexpr int kTile = 32;
constexpr int kPerLane = static_cast<int>(kMaxAttentionHeadDim / 32);

// Rows [r0, r0 + kTile) of a (rows x D) matrix whose rows are `stride`
// apart into a shared tile of stride D + 1 (zeros past `rows`), by the
// whole block.
__device__ void LoadTile(float* tile, const float* m, int64_t r0, int64_t rows, int64_t D, int64_t stride) {
  const int64_t ld = D + 1;
  for (int64_t idx = threadIdx.x; idx < kTile * D; idx += blockDim.x) {
    const int64_t j = idx / D, d = idx % D;
    tile[j * ld + d] = r0 + j < rows ? m[(r0 + j) * stride + d] : 0.0f;
  }
}

// A lane's share of a D-vector is dims lane, lane + 32, ...: acc[r] holds
// dim lane + 32 r.
// acc += c · row (the lane's dims of a shared row).
__device__ __forceinline__ void AddScaledRow(float (&acc)[kPerLane], float c, const float* row, int lane, int64_t D) {
  for (int r = 0; r < kPerLane; ++r) {
    const int64_t d = lane + 32 * r;
    if (d < D) acc[r] += c * row[d];
  }
}
// dst (a global row) = c · acc.
__device__ __forceinline__ void StoreRow(float* dst, const float (&acc)[kPerLane], float c, int lane, int64_t D) {
  for (int r = 0; r < kPerLane; ++r) {
    const int64_t d = lane + 32 * r;
    if (d < D) dst[d] = c * acc[r];
  }
}

__device__ float RowDot(const float* a, const float* b, int64_t D) {
  float sum = 0;
  for (int64_t d = 0; d < D; ++d) sum += a[d] * b[d];
  return sum;
}

__global__ void FlashForward(const float* q, const float* k, const float* v, float* y, float* lse, AttentionShape a,
                             int64_t query_blocks) {
  extern __shared__ float smem[];
  const int64_t D = a.head_dim, T = a.queries, S = a.keys, ld = D + 1;
  float* ks = smem;
  float* vs = ks + kTile * ld;
  float* qs = vs + kTile * ld;  // kWarps rows of D
  const int64_t bh = blockIdx.x / query_blocks, t0 = blockIdx.x % query_blocks * kWarps;
  const int64_t b = bh / a.heads, h = bh % a.heads;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t t = t0 + warp;
  const bool active = t < T;
  float* qrow = qs + warp * D;
  if (active) {
    for (int64_t d = lane; d < D; d += 32) qrow[d] = q[a.QueryRow(bh, t) + d];
  }
  const float* kh = k + a.KeyRow(bh, 0);
  const float* vh = v + a.KeyRow(bh, 0);
  float m = -INFINITY, l = 0, acc[kPerLane] = {};
  const int64_t key_end = KeyEnd(a, t0, kWarps < T - t0 ? kWarps : T - t0);
  for (int64_t s0 = 0; s0 < key_end; s0 += kTile) {
    __syncthreads();
    LoadTile(ks, kh, s0, S, D, a.RowStride());
    LoadTile(vs, vh, s0, S, D, a.RowStride());
    __syncthreads();
    if (!active) continue;
    const int64_t s = s0 + lane;
    const float score = Visible(a, b, t, s) ? a.scale * RowDot(qrow, ks + lane * ld, D) : -INFINITY;
    const float m_new = fmaxf(m, WarpMax(score));
    if (m_new == -INFINITY) continue;  // no visible key yet
    const float p = score == -INFINITY ? 0.0f : expf(score - m_new);
    const float correction = expf(m - m_new);  // 0 while m is -inf
    l = l * correction + WarpSum(p);           // the normaliser takes the undropped p
    const float dropped = p == 0.0f ? 0.0f : p * Keep(a, b, h, t, s);
    for (int r = 0; r < kPerLane; ++r) acc[r] *= correction;
    for (int j = 0; j < kTile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, dropped, j);
      if (pj != 0.0f) AddScaledRow(acc, pj, vs + j * ld, lane, D);
    }
    m = m_new;
  }
  if (!active) return;
  StoreRow(y + a.QueryRow(bh, t), acc, l > 0 ? 1.0f / l : 0.0f, lane, D);
  if (lane == 0) lse[bh * T + t] = l > 0 ? m + logf(l) : -INFINITY;
}

__global__ void FlashBackwardQueries(const float* q, const float* k, const float* v, const float* y, const float* lse,
                                     const float* dy, float* dq, float* delta, AttentionShape a, int64_t query_blocks) {
  extern __shared__ float smem[];
  const int64_t D = a.head_dim, T = a.queries, S = a.keys, ld = D + 1;
  float* ks = smem;
  float* vs = ks + kTile * ld;
  float* qs = vs + kTile * ld;   // kWarps rows of D
  float* dys = qs + kWarps * D;  // kWarps rows of D
  const int64_t bh = blockIdx.x / query_blocks, t0 = blockIdx.x % query_blocks * kWarps;
  const int64_t b = bh / a.heads, h = bh % a.heads;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t t = t0 + warp;
  const bool active = t < T;
  float* qrow = qs + warp * D;
  float* dyrow = dys + warp * D;
  float row_delta = 0, row_lse = -INFINITY;
  if (active) {
    float part = 0;
    for (int64_t d = lane; d < D; d += 32) {
      const int64_t i = a.QueryRow(bh, t) + d;
      qrow[d] = q[i];
      dyrow[d] = dy[i];
      part += dy[i] * y[i];
    }
    row_delta = WarpSum(part);
    row_lse = lse[bh * T + t];
    if (lane == 0) delta[bh * T + t] = row_delta;
  }
  const float* kh = k + a.KeyRow(bh, 0);
  const float* vh = v + a.KeyRow(bh, 0);
  float acc[kPerLane] = {};
  const int64_t key_end = KeyEnd(a, t0, kWarps < T - t0 ? kWarps : T - t0);
  for (int64_t s0 = 0; s0 < key_end; s0 += kTile) {
    __syncthreads();
    LoadTile(ks, kh, s0, S, D, a.RowStride());
    LoadTile(vs, vh, s0, S, D, a.RowStride());
    __syncthreads();
    if (!active || row_lse == -INFINITY) continue;
    const int64_t s = s0 + lane;
    float ds = 0;
    if (Visible(a, b, t, s)) {
      const float p = expf(a.scale * RowDot(qrow, ks + lane * ld, D) - row_lse);
      ds = p * (RowDot(dyrow, vs + lane * ld, D) * Keep(a, b, h, t, s) - row_delta);
    }
    for (int j = 0; j < kTile; ++j) {
      const float dsj = __shfl_sync(0xffffffffu, ds, j);
      if (dsj != 0.0f) AddScaledRow(acc, dsj, ks + j * ld, lane, D);
    }
  }
  if (!active) return;
  StoreRow(dq + a.QueryRow(bh, t), acc, a.scale, lane, D);
}

__global__ void FlashBackwardKeys(const float* q, const float* k, const float* v, const float* lse, const float* dy,
                                  const float* delta, float* dk, float* dv, AttentionShape a, int64_t key_blocks) {
  extern __shared__ float smem[];
  const int64_t D = a.head_dim, T = a.queries, S = a.keys, ld = D + 1;
  float* qs = smem;
  float* dys = qs + kTile * ld;
  float* krows = dys + kTile * ld;    // kWarps rows of D
  float* vrows = krows + kWarps * D;  // kWarps rows of D
  float* lses = vrows + kWarps * D;   // kTile
  float* deltas = lses + kTile;       // kTile
  const int64_t bh = blockIdx.x / key_blocks, s0 = blockIdx.x % key_blocks * kWarps;
  const int64_t b = bh / a.heads, h = bh % a.heads;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t s = s0 + warp;
  const bool active = s < S;
  float* krow = krows + warp * D;
  float* vrow = vrows + warp * D;
  if (active) {
    for (int64_t d = lane; d < D; d += 32) {
      krow[d] = k[a.KeyRow(bh, s) + d];
      vrow[d] = v[a.KeyRow(bh, s) + d];
    }
  }
  const float* qh = q + a.QueryRow(bh, 0);
  const float* dyh = dy + a.QueryRow(bh, 0);
  float dk_acc[kPerLane] = {}, dv_acc[kPerLane] = {};
  // The first query that may see key s0 (the block's first key).
  int64_t first = a.causal ? s0 - a.causal_shift : 0;
  first = first < 0 ? 0 : first;
  for (int64_t t0 = first / kTile * kTile; t0 < T; t0 += kTile) {
    __syncthreads();
    LoadTile(qs, qh, t0, T, D, a.RowStride());
    LoadTile(dys, dyh, t0, T, D, a.RowStride());
    for (int64_t i = threadIdx.x; i < kTile; i += blockDim.x) {
      lses[i] = t0 + i < T ? lse[bh * T + t0 + i] : -INFINITY;
      deltas[i] = t0 + i < T ? delta[bh * T + t0 + i] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    const int64_t t = t0 + lane;
    float p = 0, ds = 0;
    if (t < T && lses[lane] != -INFINITY && Visible(a, b, t, s)) {
      const float keep = Keep(a, b, h, t, s);
      const float undropped = expf(a.scale * RowDot(qs + lane * ld, krow, D) - lses[lane]);
      ds = undropped * (RowDot(dys + lane * ld, vrow, D) * keep - deltas[lane]);
      p = undropped * keep;  // what dv takes
    }
    for (int i = 0; i < kTile; ++i) {
      const float pi = __shfl_sync(0xffffffffu, p, i);
      const float dsi = __shfl_sync(0xffffffffu, ds, i);
      if (pi != 0.0f) AddScaledRow(dv_acc, pi, dys + i * ld, lane, D);
      if (dsi != 0.0f) AddScaledRow(dk_acc, dsi, qs + i * ld, lane, D);
    }
  }
  if (!active) return;
  StoreRow(dk + a.KeyRow(bh, s), dk_acc, a.scale, lane, D);
  StoreRow(dv + a.KeyRow(bh, s), dv_acc, 1.0f, lane, D);
}

size_t TileBytes(int64_t D) { return static_cast<size_t>(2 * kTile * (D + 1) + 2 * kWarps * D + 2 * kTile) * 4; }

}  // namespace

int LaunchFlashAttention(const float* q, const float* k, const float* v, float* y, float* lse,
                         const AttentionShape& shape) {
  const int64_t blocks = (shape.queries + kWarps - 1) / kWarps;
  const int64_t grid = shape.batch * shape.heads * blocks;
  if (grid == 0) return 0;
  FlashForward<<<static_cast<unsigned>(grid), kWarps * 32, TileBytes(shape.head_dim), CurrentStream()>>>(
      q, k, v, y, lse, shape, blocks);
  return Finish();
}

int LaunchFlashAttentionGrad(const float* q, const float* k, const float* v, const float* y, const float* lse,
                             const float* dy, float* dq, float* dk, float* dv, float* delta,
                             const AttentionShape& shape) {
  return attention::WithDelta(shape, sizeof(float), dk, dv, delta, [&](float* d) {
    const int64_t BH = shape.batch * shape.heads;
    const cudaStream_t stream = CurrentStream();
    const int64_t query_blocks = (shape.queries + kWarps - 1) / kWarps;
    FlashBackwardQueries<<<static_cast<unsigned>(BH * query_blocks), kWarps * 32, TileBytes(shape.head_dim), stream>>>(
        q, k, v, y, lse, dy, dq, d, shape, query_blocks);
    const int64_t key_blocks = (shape.keys + kWarps - 1) / kWarps;
    if (key_blocks > 0) {
      FlashBackwardKeys<<<static_cast<unsigned>(BH * key_blocks), kWarps * 32, TileBytes(shape.head_dim), stream>>>(
          q, k, v, lse, dy, d, dk, dv, shape, key_blocks);
    }
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace tessera::ops::cuda
