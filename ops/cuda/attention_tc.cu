// Fused attention on tensor cores, for bf16 and f16 q, k, v (launch.h:
// LaunchFlashAttention16, LaunchFlashAttentionGrad16): the products run as
// mma.sync.m16n8k16 (16-bit operands, f32 accumulators), the softmax in f32
// registers. Blocks of kWarps warps, each warp 16 rows:
//   forward: 64 queries a block, q's fragments kept in registers, tiles of
//     64 keys (k, v) in shared memory; S = q kᵀ and the online softmax in
//     the accumulators (the row max and sum across the 4 lanes of a row),
//     P rounded to the operand type and multiplied into O = P v.
//   backward 1: 64 queries a block (q and dy fragments in registers),
//     tiles of 32 keys: P from lse, dP = dy vᵀ, dS = P ⊙ (dP ⊙ Z - delta),
//     dq = scale · dS k. delta = Σ dy ⊙ y (f32) goes to the workspace.
//   backward 2: 64 keys a block (k, v in shared memory), tiles of 32
//     queries: Sᵀ = k qᵀ, dPᵀ = v dyᵀ, dv = (P ⊙ Z)ᵀ dy, dk = scale · dSᵀ q.
// Every sum has one order (no atomics). dy (f32) is rounded to the operand
// type on its way into shared memory, as autocast rounds a matmul's dY.
// The accumulators' (row, column) per lane follow PTX's "Matrix Fragments
// for mma.m16n8k16 with floating point type": lane = 4 g + c holds rows g
// and g + 8, columns 2c and 2c + 1 of each 16 x 8 tile. Head dims are
// padded with zeros to 32, 64 or 128 (kD). Shared rows are kD + 8 values
// long, so the fragment loads of a warp fall in different banks.
// Exponentials are base 2 (scores pre-multiplied by log2 e).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

using attention::Keep;
using attention::KeyEnd;
using attention::Visible;
using attention::WarpSum;

constexpr int kWarps = 4;
constexpr int kWarpRows = 16;
constexpr int kBlockRows = kWarps * kWarpRows;  // queries (forward, dq) or keys (dk, dv) a block
constexpr int kForwardKeys = 64;                // key tile of the forward
constexpr int kGradTile = 32;                   // key tile of dq, query tile of dk and dv
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Bf16 {
  static constexpr bool kBf16 = true;
};
struct F16 {
  static constexpr bool kBf16 = false;
};

template <class E>
__device__ __forceinline__ uint32_t Bits(float x) {
  if constexpr (E::kBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  } else {
    return __half_as_ushort(__float2half_rn(x));
  }
}
// Two values as one operand register (lo in the low half).
template <class E>
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  return Bits<E>(lo) | (Bits<E>(hi) << 16);
}

// c (16 x 8) += a (16 x 16) b (16 x 8), by the whole warp.
template <class E>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
  if constexpr (E::kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();  // the build's architectures are 80 and up (CMAKE_CUDA_ARCHITECTURES)
#endif
#elif defined(TESSERA_CUDA_EMU)
  const uint32_t b[2] = {b0, b1};
  cuda_emu::WarpMma16816(c, a, b, E::kBf16);
#endif
}

__device__ __forceinline__ uint32_t Word(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Fragment loads from shared tiles of rows of kLd values. g = lane / 4,
// c = lane % 4.
// a = rows [r0, r0 + 16), columns [k0, k0 + 16) of a row-major tile.
template <int kLd>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const uint16_t* s, int r0, int k0, int g, int c) {
  const uint16_t* p = s + (r0 + g) * kLd + k0 + 2 * c;
  a[0] = Word(p);
  a[1] = Word(p + 8 * kLd);
  a[2] = Word(p + 8);
  a[3] = Word(p + 8 * kLd + 8);
}
// b (16 x 8) with b[k][n] = s[n0 + n][k0 + k]: rows of the tile as columns
// (k of q kᵀ).
template <int kLd>
__device__ __forceinline__ void LoadBRows(uint32_t& b0, uint32_t& b1, const uint16_t* s, int n0, int k0, int g, int c) {
  const uint16_t* p = s + (n0 + g) * kLd + k0 + 2 * c;
  b0 = Word(p);
  b1 = Word(p + 8);
}
// b (16 x 8) with b[k][n] = s[k0 + k][n0 + n] (v of P v).
template <int kLd>
__device__ __forceinline__ void LoadB(uint32_t& b0, uint32_t& b1, const uint16_t* s, int k0, int n0, int g, int c) {
  const uint16_t* p = s + (k0 + 2 * c) * kLd + n0 + g;
  b0 = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[kLd]) << 16);
  b1 = static_cast<uint32_t>(p[8 * kLd]) | (static_cast<uint32_t>(p[9 * kLd]) << 16);
}
// The A fragment of k-slice j (columns [16 j, 16 j + 16)) of accumulators
// x (tiles of 8 columns), rounded to the operand type.
template <class E, int kTiles>
__device__ __forceinline__ void AccumulatorsAsA(uint32_t (&a)[4], const float (&x)[kTiles][4], int j) {
  a[0] = Pack<E>(x[2 * j][0], x[2 * j][1]);
  a[1] = Pack<E>(x[2 * j][2], x[2 * j][3]);
  a[2] = Pack<E>(x[2 * j + 1][0], x[2 * j + 1][1]);
  a[3] = Pack<E>(x[2 * j + 1][2], x[2 * j + 1][3]);
}
// out (16 x kD, tiles of 8 columns) += x (16 x 8 kTiles accumulators, each
// k-slice rounded to the operand type) times rows [0, 8 kTiles) of the
// row-major shared tile s (P v, dS k, Pᵀ dy, dSᵀ q).
template <class E, int kLd, int kTiles, int kOut>
__device__ __forceinline__ void MmaAccumulators(float (&out)[kOut][4], const float (&x)[kTiles][4], const uint16_t* s,
                                                int g, int c) {
  for (int j = 0; j < kTiles / 2; ++j) {
    uint32_t xa[4];
    AccumulatorsAsA<E>(xa, x, j);
    for (int n = 0; n < kOut; ++n) {
      uint32_t b0, b1;
      LoadB<kLd>(b0, b1, s, j * 16, n * 8, g, c);
      Mma<E>(out[n], xa, b0, b1);
    }
  }
}

// Rows [r0, r0 + R) of a (rows x D) matrix whose rows are `stride` apart
// into a shared tile of kD columns (zeros past `rows` and past D), by the
// whole block.
template <int R, int kD>
__device__ void LoadTile(uint16_t* tile, const uint16_t* m, int64_t r0, int64_t rows, int64_t D, int64_t stride) {
  constexpr int kLd = kD + 8;
  // 8 values (16 bytes) at a time when every row starts 16-byte aligned.
  if (D == kD && stride % 8 == 0 && (reinterpret_cast<uintptr_t>(m) & 15) == 0) {
    constexpr int kChunks = kD / 8;
    for (int idx = static_cast<int>(threadIdx.x); idx < R * kChunks; idx += static_cast<int>(blockDim.x)) {
      const int r = idx / kChunks, d = idx % kChunks * 8;
      uint4 x = make_uint4(0, 0, 0, 0);
      if (r0 + r < rows) x = *reinterpret_cast<const uint4*>(m + (r0 + r) * stride + d);
      *reinterpret_cast<uint4*>(tile + r * kLd + d) = x;
    }
    return;
  }
  for (int idx = static_cast<int>(threadIdx.x); idx < R * kD; idx += static_cast<int>(blockDim.x)) {
    const int r = idx / kD, d = idx % kD;
    tile[r * kLd + d] = r0 + r < rows && d < D ? m[(r0 + r) * stride + d] : uint16_t{0};
  }
}
// The same from f32, rounded to the operand type.
template <class E, int R, int kD>
__device__ void LoadTileRounded(uint16_t* tile, const float* m, int64_t r0, int64_t rows, int64_t D, int64_t stride) {
  constexpr int kLd = kD + 8;
  for (int idx = static_cast<int>(threadIdx.x); idx < R * kD; idx += static_cast<int>(blockDim.x)) {
    const int r = idx / kD, d = idx % kD;
    tile[r * kLd + d] = static_cast<uint16_t>(r0 + r < rows && d < D ? Bits<E>(m[(r0 + r) * stride + d]) : 0u);
  }
}

// The row (0: g, 1: g + 8) and column of accumulator element e of a tile.
__device__ __forceinline__ int RowOf(int e) { return e / 2; }
__device__ __forceinline__ int ColumnOf(int n, int e, int c) { return n * 8 + 2 * c + e % 2; }

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The dropout multipliers z[e] of a lane's four elements of a 16 x 8 tile
// (e as the accumulators: rows g, g, g + 8, g + 8; columns 2c, 2c + 1).
// Keep draws a Philox block of four words for each element; when the keys
// are a multiple of 4 (a block is then 4 aligned keys of one query) the
// lanes holding a block's four elements draw it once between them and pass
// the words by shuffles: a quarter of the draws, which would otherwise
// cost more than the tile's products. Every lane of the warp calls it.
// Rows queries, columns keys (forward, dq): the block of row g's keys
// 4 floor(c / 2) .. + 3 is in lanes c and c ^ 1; the even lane draws row
// g's, the odd one row g + 8's.
__device__ __forceinline__ void KeepQueryRows(const AttentionShape& a, int64_t b, int64_t h, int64_t t_g, int64_t s_2c,
                                              int c, float (&z)[4]) {
  if (a.keys % 4 != 0) {
    for (int e = 0; e < 4; ++e) z[e] = Keep(a, b, h, t_g + 8 * (e / 2), s_2c + e % 2);
    return;
  }
  const bool odd = (c & 1) != 0;
  const auto w = attention::KeepWords(a, b, h, odd ? t_g + 8 : t_g, s_2c - (odd ? 2 : 0));
  // Even lane: row g's words 0, 1 are its own, row g + 8's the odd lane's
  // 0, 1; odd lane: row g's are the even lane's 2, 3, row g + 8's its own.
  const uint32_t x0 = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[2], 1);
  const uint32_t x1 = __shfl_xor_sync(0xffffffffu, odd ? w[1] : w[3], 1);
  z[0] = attention::KeepOf(a, odd ? x0 : w[0]);
  z[1] = attention::KeepOf(a, odd ? x1 : w[1]);
  z[2] = attention::KeepOf(a, odd ? w[2] : x0);
  z[3] = attention::KeepOf(a, odd ? w[3] : x1);
}
// Rows keys, columns queries (dk, dv): the block of query column q's keys
// 4 floor(g / 4) .. + 3 (and + 8) is in the lanes j = g % 4 = 0..3 of one
// c (lanes 4 g + c); lane j draws the block of element j (query 2c + j % 2,
// the keys of row g's group for j < 2, of row g + 8's for j >= 2) and the
// four pass the words to each other, a 4 x 4 transpose by shuffles.
__device__ __forceinline__ void KeepKeyRows(const AttentionShape& a, int64_t b, int64_t h, int64_t s_g, int64_t t_2c,
                                            int g, float (&z)[4]) {
  if (a.keys % 4 != 0) {
    for (int e = 0; e < 4; ++e) z[e] = Keep(a, b, h, t_2c + e % 2, s_g + 8 * (e / 2));
    return;
  }
  const int j = g % 4;
  const auto w = attention::KeepWords(a, b, h, t_2c + j % 2, s_g - j + 8 * (j / 2));
  uint32_t word[4];  // word[e]: element e's, from the lane that drew it
  for (int e = 0; e < 4; ++e) word[e] = w[static_cast<size_t>(j)];
  for (int r = 1; r < 4; ++r) {
    // Lane j ^ r drew element (j ^ r)'s block: send it word j ^ r of this
    // lane's block (its element j), receive word j of its block.
    const int other = j ^ r;
    const uint32_t sent = other == 0 ? w[0] : other == 1 ? w[1] : other == 2 ? w[2] : w[3];
    const uint32_t got = __shfl_xor_sync(0xffffffffu, sent, 4 * r);
    for (int e = 0; e < 4; ++e) word[e] = e == other ? got : word[e];
  }
  for (int e = 0; e < 4; ++e) z[e] = attention::KeepOf(a, word[e]);
}

template <class E, int kD>
__global__ void __launch_bounds__(kWarps * 32) TcForward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                                         float* y, float* lse, AttentionShape a, int64_t query_blocks) {
  constexpr int kLd = kD + 8, kSlices = kD / 16, kOut = kD / 8, kScores = kForwardKeys / 8;
  extern __shared__ uint4 smem_tc[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem_tc);
  uint16_t* vs = ks + kForwardKeys * kLd;
  const int64_t D = a.head_dim, T = a.queries, S = a.keys;
  const int64_t bh = blockIdx.x / query_blocks, t0 = blockIdx.x % query_blocks * kBlockRows;
  const int64_t b = bh / a.heads, h = bh % a.heads;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, c = lane % 4;
  const int64_t tw = t0 + warp * kWarpRows;  // the warp's first query
  static_assert(kBlockRows == kForwardKeys, "q is staged in the key tile");
  LoadTile<kBlockRows, kD>(ks, q + a.QueryRow(bh, 0), t0, T, D, a.RowStride());
  __syncthreads();
  uint32_t qa[kSlices][4];
  for (int j = 0; j < kSlices; ++j) LoadA<kLd>(qa[j], ks, warp * kWarpRows, j * 16, g, c);
  float o[kOut][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale2 = a.scale * kLog2e;
  const int64_t key_end = KeyEnd(a, t0, T - t0 < kBlockRows ? T - t0 : kBlockRows);
  for (int64_t s0 = 0; s0 < key_end; s0 += kForwardKeys) {
    __syncthreads();
    LoadTile<kForwardKeys, kD>(ks, k + a.KeyRow(bh, 0), s0, S, D, a.RowStride());
    LoadTile<kForwardKeys, kD>(vs, v + a.KeyRow(bh, 0), s0, S, D, a.RowStride());
    __syncthreads();
    // No row of the warp's sees a key of the tile.
    if (tw >= T || (a.causal && s0 > tw + kWarpRows - 1 + a.causal_shift)) continue;
    float s[kScores][4] = {};
    for (int j = 0; j < kSlices; ++j) {
      for (int n = 0; n < kScores; ++n) {
        uint32_t b0, b1;
        LoadBRows<kLd>(b0, b1, ks, n * 8, j * 16, g, c);
        Mma<E>(s[n], qa[j], b0, b1);
      }
    }
    // Every (row, key) of the warp's visible: no test per element.
    const bool whole =
        a.mask == nullptr && s0 + kForwardKeys <= S && (!a.causal || s0 + kForwardKeys - 1 <= tw + a.causal_shift);
    float row_max[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < kScores; ++n) {
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * scale2;
        if (!whole && !Visible(a, b, tw + g + 8 * RowOf(e), s0 + ColumnOf(n, e, c))) x = -INFINITY;
        s[n][e] = x;
        row_max[RowOf(e)] = fmaxf(row_max[RowOf(e)], x);
      }
    }
    float correction[2], row_sum[2] = {0.0f, 0.0f};
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], QuadMax(row_max[r]));
      correction[r] = m_new == -INFINITY ? 1.0f : exp2f(m[r] - m_new);  // 0 while m is -inf
      m[r] = m_new;
    }
    for (int n = 0; n < kScores; ++n) {
      float z[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      if (a.dropout_rate > 0.0f) KeepQueryRows(a, b, h, tw + g, s0 + ColumnOf(n, 0, c), c, z);
      for (int e = 0; e < 4; ++e) {
        const int r = RowOf(e);
        const float p = s[n][e] == -INFINITY ? 0.0f : exp2f(s[n][e] - m[r]);
        row_sum[r] += p;  // the normaliser takes the undropped p
        s[n][e] = p * z[e];
      }
    }
    for (int r = 0; r < 2; ++r) l[r] = l[r] * correction[r] + QuadSum(row_sum[r]);
    for (int n = 0; n < kOut; ++n) {
      for (int e = 0; e < 4; ++e) o[n][e] *= correction[RowOf(e)];
    }
    MmaAccumulators<E, kLd>(o, s, vs, g, c);
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t t = tw + g + 8 * r;
    if (t >= T) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* yr = y + a.QueryRow(bh, t);
    for (int n = 0; n < kOut; ++n) {
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        const int d = ColumnOf(n, e, c);
        if (d < D) yr[d] = o[n][e] * inv;
      }
    }
    if (c == 0) lse[bh * T + t] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * kLn2 : -INFINITY;
  }
}

template <class E, int kD>
__global__ void __launch_bounds__(kWarps * 32)
    TcGradQueries(const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* y, const float* lse,
                  const float* dy, uint16_t* dq, float* delta, AttentionShape a, int64_t query_blocks) {
  constexpr int kLd = kD + 8, kSlices = kD / 16, kOut = kD / 8, kScores = kGradTile / 8;
  extern __shared__ uint4 smem_tc[];
  // 2 kBlockRows rows: q and dy staged, then the key tiles (k, v).
  uint16_t* tiles = reinterpret_cast<uint16_t*>(smem_tc);
  uint16_t* ks = tiles;
  uint16_t* vs = tiles + kGradTile * kLd;
  float* deltas = reinterpret_cast<float*>(tiles + 2 * kBlockRows * kLd);  // kBlockRows
  const int64_t D = a.head_dim, T = a.queries, S = a.keys;
  const int64_t bh = blockIdx.x / query_blocks, t0 = blockIdx.x % query_blocks * kBlockRows;
  const int64_t b = bh / a.heads, h = bh % a.heads;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, c = lane % 4;
  const int64_t tw = t0 + warp * kWarpRows;
  LoadTile<kBlockRows, kD>(tiles, q + a.QueryRow(bh, 0), t0, T, D, a.RowStride());
  LoadTileRounded<E, kBlockRows, kD>(tiles + kBlockRows * kLd, dy + a.QueryRow(bh, 0), t0, T, D, a.RowStride());
  for (int r = 0; r < kWarpRows; ++r) {  // delta = Σ dy ⊙ y in f32, a warp a row
    const int64_t t = tw + r;
    float part = 0.0f;
    if (t < T) {
      for (int64_t d = lane; d < D; d += 32) part += dy[a.QueryRow(bh, t) + d] * y[a.QueryRow(bh, t) + d];
    }
    part = WarpSum(part);
    if (lane == 0) {
      deltas[warp * kWarpRows + r] = part;
      if (t < T) delta[bh * T + t] = part;
    }
  }
  __syncthreads();
  uint32_t qa[kSlices][4], dya[kSlices][4];
  for (int j = 0; j < kSlices; ++j) {
    LoadA<kLd>(qa[j], tiles, warp * kWarpRows, j * 16, g, c);
    LoadA<kLd>(dya[j], tiles + kBlockRows * kLd, warp * kWarpRows, j * 16, g, c);
  }
  float row_delta[2], row_lse[2];  // lse in base 2
  for (int r = 0; r < 2; ++r) {
    const int row = warp * kWarpRows + g + 8 * r;
    row_delta[r] = deltas[row];
    row_lse[r] = t0 + row < T ? lse[bh * T + t0 + row] * kLog2e : -INFINITY;
  }
  float dq_acc[kOut][4] = {};
  const float scale2 = a.scale * kLog2e;
  const int64_t key_end = KeyEnd(a, t0, T - t0 < kBlockRows ? T - t0 : kBlockRows);
  for (int64_t s0 = 0; s0 < key_end; s0 += kGradTile) {
    __syncthreads();
    LoadTile<kGradTile, kD>(ks, k + a.KeyRow(bh, 0), s0, S, D, a.RowStride());
    LoadTile<kGradTile, kD>(vs, v + a.KeyRow(bh, 0), s0, S, D, a.RowStride());
    __syncthreads();
    if (tw >= T || (a.causal && s0 > tw + kWarpRows - 1 + a.causal_shift)) continue;
    float s[kScores][4] = {}, dp[kScores][4] = {};
    for (int j = 0; j < kSlices; ++j) {
      for (int n = 0; n < kScores; ++n) {
        uint32_t b0, b1;
        LoadBRows<kLd>(b0, b1, ks, n * 8, j * 16, g, c);
        Mma<E>(s[n], qa[j], b0, b1);
        LoadBRows<kLd>(b0, b1, vs, n * 8, j * 16, g, c);
        Mma<E>(dp[n], dya[j], b0, b1);
      }
    }
    const bool whole =
        a.mask == nullptr && s0 + kGradTile <= S && (!a.causal || s0 + kGradTile - 1 <= tw + a.causal_shift);
    for (int n = 0; n < kScores; ++n) {
      float z[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      if (a.dropout_rate > 0.0f) KeepQueryRows(a, b, h, tw + g, s0 + ColumnOf(n, 0, c), c, z);
      for (int e = 0; e < 4; ++e) {
        const int r = RowOf(e);
        const int64_t t = tw + g + 8 * r, key = s0 + ColumnOf(n, e, c);
        float ds = 0.0f;
        if (row_lse[r] != -INFINITY && (whole || Visible(a, b, t, key))) {
          const float p = exp2f(s[n][e] * scale2 - row_lse[r]);
          ds = p * (dp[n][e] * z[e] - row_delta[r]);
        }
        s[n][e] = ds;
      }
    }
    MmaAccumulators<E, kLd>(dq_acc, s, ks, g, c);
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t t = tw + g + 8 * r;
    if (t >= T) continue;
    uint16_t* row = dq + a.QueryRow(bh, t);
    for (int n = 0; n < kOut; ++n) {
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        const int d = ColumnOf(n, e, c);
        if (d < D) row[d] = static_cast<uint16_t>(Bits<E>(dq_acc[n][e] * a.scale));
      }
    }
  }
}

template <class E, int kD>
__global__ void __launch_bounds__(kWarps * 32)
    TcGradKeys(const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* lse, const float* dy,
               const float* delta, uint16_t* dk, uint16_t* dv, AttentionShape a, int64_t key_blocks) {
  constexpr int kLd = kD + 8, kSlices = kD / 16, kOut = kD / 8, kScores = kGradTile / 8;
  extern __shared__ uint4 smem_tc[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem_tc);
  uint16_t* vs = ks + kBlockRows * kLd;
  uint16_t* qs = vs + kBlockRows * kLd;
  uint16_t* dys = qs + kGradTile * kLd;
  float* lses = reinterpret_cast<float*>(dys + kGradTile * kLd);  // kGradTile, base 2
  float* deltas = lses + kGradTile;                               // kGradTile
  const int64_t D = a.head_dim, T = a.queries, S = a.keys;
  const int64_t bh = blockIdx.x / key_blocks, s0 = blockIdx.x % key_blocks * kBlockRows;
  const int64_t b = bh / a.heads, h = bh % a.heads;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, c = lane % 4;
  const int64_t sw = s0 + warp * kWarpRows;  // the warp's first key
  LoadTile<kBlockRows, kD>(ks, k + a.KeyRow(bh, 0), s0, S, D, a.RowStride());
  LoadTile<kBlockRows, kD>(vs, v + a.KeyRow(bh, 0), s0, S, D, a.RowStride());
  float dk_acc[kOut][4] = {}, dv_acc[kOut][4] = {};
  const float scale2 = a.scale * kLog2e;
  // The first query that may see the block's first key.
  int64_t first = a.causal ? s0 - a.causal_shift : 0;
  first = first < 0 ? 0 : first;
  for (int64_t t0 = first / kGradTile * kGradTile; t0 < T; t0 += kGradTile) {
    __syncthreads();
    LoadTile<kGradTile, kD>(qs, q + a.QueryRow(bh, 0), t0, T, D, a.RowStride());
    LoadTileRounded<E, kGradTile, kD>(dys, dy + a.QueryRow(bh, 0), t0, T, D, a.RowStride());
    for (int i = static_cast<int>(threadIdx.x); i < kGradTile; i += static_cast<int>(blockDim.x)) {
      lses[i] = t0 + i < T ? lse[bh * T + t0 + i] * kLog2e : -INFINITY;
      deltas[i] = t0 + i < T ? delta[bh * T + t0 + i] : 0.0f;
    }
    __syncthreads();
    // No query of the tile sees a key of the warp's.
    if (sw >= S || (a.causal && t0 + kGradTile - 1 + a.causal_shift < sw)) continue;
    float st[kScores][4] = {}, dpt[kScores][4] = {};  // rows: the warp's keys; columns: the tile's queries
    for (int j = 0; j < kSlices; ++j) {
      uint32_t ka[4], va[4];
      LoadA<kLd>(ka, ks, warp * kWarpRows, j * 16, g, c);
      LoadA<kLd>(va, vs, warp * kWarpRows, j * 16, g, c);
      for (int n = 0; n < kScores; ++n) {
        uint32_t b0, b1;
        LoadBRows<kLd>(b0, b1, qs, n * 8, j * 16, g, c);
        Mma<E>(st[n], ka, b0, b1);
        LoadBRows<kLd>(b0, b1, dys, n * 8, j * 16, g, c);
        Mma<E>(dpt[n], va, b0, b1);
      }
    }
    const bool whole =
        a.mask == nullptr && sw + kWarpRows <= S && (!a.causal || sw + kWarpRows - 1 <= t0 + a.causal_shift);
    for (int n = 0; n < kScores; ++n) {
      float z[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      if (a.dropout_rate > 0.0f) KeepKeyRows(a, b, h, sw + g, t0 + ColumnOf(n, 0, c), g, z);
      for (int e = 0; e < 4; ++e) {
        const int col = ColumnOf(n, e, c);
        const int64_t t = t0 + col, key = sw + g + 8 * RowOf(e);
        float pz = 0.0f, ds = 0.0f;
        if (lses[col] != -INFINITY && (whole || Visible(a, b, t, key))) {
          const float p = exp2f(st[n][e] * scale2 - lses[col]);
          pz = p * z[e];
          ds = p * (dpt[n][e] * z[e] - deltas[col]);
        }
        st[n][e] = pz;
        dpt[n][e] = ds;
      }
    }
    MmaAccumulators<E, kLd>(dv_acc, st, dys, g, c);
    MmaAccumulators<E, kLd>(dk_acc, dpt, qs, g, c);
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t key = sw + g + 8 * r;
    if (key >= S) continue;
    uint16_t* dk_row = dk + a.KeyRow(bh, key);
    uint16_t* dv_row = dv + a.KeyRow(bh, key);
    for (int n = 0; n < kOut; ++n) {
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        const int d = ColumnOf(n, e, c);
        if (d < D) {
          dk_row[d] = static_cast<uint16_t>(Bits<E>(dk_acc[n][e] * a.scale));
          dv_row[d] = static_cast<uint16_t>(Bits<E>(dv_acc[n][e]));
        }
      }
    }
  }
}

constexpr size_t TileBytes(int rows, int kD) { return static_cast<size_t>(rows) * (kD + 8) * 2; }

// Raises a kernel's dynamic shared memory limit past the default 48 KiB
// when it needs more (the head dim 128 gradient).
template <class Kernel>
cudaError_t AllowShared(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

template <class E, int kD>
int Forward(const void* q, const void* k, const void* v, float* y, float* lse, const AttentionShape& shape) {
  const int64_t blocks = (shape.queries + kBlockRows - 1) / kBlockRows;
  const int64_t grid = shape.batch * shape.heads * blocks;
  if (grid == 0) return 0;
  const size_t bytes = 2 * TileBytes(kForwardKeys, kD);
  if (const cudaError_t err = AllowShared(TcForward<E, kD>, bytes); err != cudaSuccess) return static_cast<int>(err);
  TcForward<E, kD><<<static_cast<unsigned>(grid), kWarps * 32, bytes, CurrentStream()>>>(
      static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v), y, lse, shape,
      blocks);
  return Finish();
}

template <class E, int kD>
int Grad(const void* q, const void* k, const void* v, const float* y, const float* lse, const float* dy, void* dq,
         void* dk, void* dv, float* delta, const AttentionShape& shape) {
  const int64_t BH = shape.batch * shape.heads;
  const cudaStream_t stream = CurrentStream();
  const auto* q16 = static_cast<const uint16_t*>(q);
  const auto* k16 = static_cast<const uint16_t*>(k);
  const auto* v16 = static_cast<const uint16_t*>(v);
  const int64_t query_blocks = (shape.queries + kBlockRows - 1) / kBlockRows;
  const size_t query_bytes = TileBytes(2 * kBlockRows, kD) + kBlockRows * sizeof(float);
  if (const cudaError_t err = AllowShared(TcGradQueries<E, kD>, query_bytes); err != cudaSuccess) {
    return static_cast<int>(err);
  }
  TcGradQueries<E, kD><<<static_cast<unsigned>(BH * query_blocks), kWarps * 32, query_bytes, stream>>>(
      q16, k16, v16, y, lse, dy, static_cast<uint16_t*>(dq), delta, shape, query_blocks);
  const int64_t key_blocks = (shape.keys + kBlockRows - 1) / kBlockRows;
  const size_t key_bytes = 2 * TileBytes(kBlockRows, kD) + 2 * TileBytes(kGradTile, kD) + 2 * kGradTile * sizeof(float);
  if (const cudaError_t err = AllowShared(TcGradKeys<E, kD>, key_bytes); err != cudaSuccess) {
    return static_cast<int>(err);
  }
  if (key_blocks > 0) {
    TcGradKeys<E, kD><<<static_cast<unsigned>(BH * key_blocks), kWarps * 32, key_bytes, stream>>>(
        q16, k16, v16, lse, dy, delta, static_cast<uint16_t*>(dk), static_cast<uint16_t*>(dv), shape, key_blocks);
  }
  return static_cast<int>(cudaGetLastError());
}

// The padded head dim: 32, 64 or 128.
int PaddedHeadDim(int64_t D) { return D <= 32 ? 32 : (D <= 64 ? 64 : 128); }

template <class E>
int ForwardFor(const void* q, const void* k, const void* v, float* y, float* lse, const AttentionShape& shape) {
  switch (PaddedHeadDim(shape.head_dim)) {
    case 32:
      return Forward<E, 32>(q, k, v, y, lse, shape);
    case 64:
      return Forward<E, 64>(q, k, v, y, lse, shape);
    default:
      return Forward<E, 128>(q, k, v, y, lse, shape);
  }
}

template <class E>
int GradFor(const void* q, const void* k, const void* v, const float* y, const float* lse, const float* dy, void* dq,
            void* dk, void* dv, float* delta, const AttentionShape& shape) {
  switch (PaddedHeadDim(shape.head_dim)) {
    case 32:
      return Grad<E, 32>(q, k, v, y, lse, dy, dq, dk, dv, delta, shape);
    case 64:
      return Grad<E, 64>(q, k, v, y, lse, dy, dq, dk, dv, delta, shape);
    default:
      return Grad<E, 128>(q, k, v, y, lse, dy, dq, dk, dv, delta, shape);
  }
}

}  // namespace

int LaunchFlashAttention16(bool bf16, const void* q, const void* k, const void* v, float* y, float* lse,
                           const AttentionShape& shape) {
  return bf16 ? ForwardFor<Bf16>(q, k, v, y, lse, shape) : ForwardFor<F16>(q, k, v, y, lse, shape);
}

int LaunchFlashAttentionGrad16(bool bf16, const void* q, const void* k, const void* v, const float* y, const float* lse,
                               const float* dy, void* dq, void* dk, void* dv, float* delta,
                               const AttentionShape& shape) {
  return attention::WithDelta(shape, 2, dk, dv, delta, [&](float* d) {
    return bf16 ? GradFor<Bf16>(q, k, v, y, lse, dy, dq, dk, dv, d, shape)
                : GradFor<F16>(q, k, v, y, lse, dy, dq, dk, dv, d, shape);
  });
}

}  // namespace tessera::ops::cuda
