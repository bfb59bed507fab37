// CUDA reductions (ops/cuda/launch.h LaunchReduce, LaunchReduceMaxGrad,
// LaunchArgmax, LaunchTopK). LaunchReduce cuts each output's reduced
// coordinates into ReduceChunks ranges (ops/reduce_chunks.h): a block per
// (output, range), its threads striding over the range, then a block
// reduction in shared memory; or, where consecutive outputs are adjacent in
// memory (a bias gradient's columns), a block per (32 outputs, range) whose
// warps read 32 adjacent floats per reduced coordinate. With more than one
// range the blocks write double partials, combined in range order by
// CombineChunks. The other kernels take one block per output element.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"
#include "ops/reduce_chunks.h"

namespace tessera::ops::cuda {
namespace {

__device__ int64_t Offset(int64_t index, int rank, const int64_t* dims, const int64_t* strides) {
  if (rank == 1) return index * strides[0];  // index < dims[0]: no division
  int64_t offset = 0;
  for (int a = rank - 1; a >= 0; --a) {
    offset += (index % dims[a]) * strides[a];
    index /= dims[a];
  }
  return offset;
}

// kind: 0 sum, 1 max, 2 sum of squares (ops/cuda/launch.h).
__device__ double Identity(int kind) { return kind == 1 ? -INFINITY : 0.0; }
// An input element as f32 (exact).
__device__ __forceinline__ float Widen(float v) { return v; }
__device__ __forceinline__ float Widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float Widen(__half v) { return __half2float(v); }

// The larger, NaN winning, as the CPU's max (fmax would skip it).
__device__ __forceinline__ double MaxNan(double a, double b) { return (a > b || isnan(a)) ? a : b; }
// acc with one element taken in.
__device__ double Take(int kind, double acc, float v) {
  if (kind == 1) return MaxNan(acc, static_cast<double>(v));
  return acc + (kind == 2 ? static_cast<double>(v) * v : static_cast<double>(v));
}
// Two partial results combined.
__device__ double Join(int kind, double a, double b) { return kind == 1 ? MaxNan(a, b) : a + b; }
__device__ float Result(int kind, double acc, float scale) {
  return kind == 1 ? static_cast<float>(acc) : static_cast<float>(acc) * scale;
}

// Block (output o, range c) of items o * chunks + c: y[o] when chunks is 1,
// else partials[o * chunks + c].
template <class T>
__global__ void ReduceKernel(int kind, const T* x, float* y, double* partials, int64_t outputs, int64_t reduced,
                             int64_t chunks, ReduceLayout l, float scale) {
  __shared__ double scratch[kThreads];
  const int64_t length = (reduced + chunks - 1) / chunks;
  for (int64_t item = blockIdx.x; item < outputs * chunks; item += gridDim.x) {
    const int64_t o = item / chunks, begin = item % chunks * length;
    const int64_t end = begin + length < reduced ? begin + length : reduced;
    const int64_t base = Offset(o, l.kept_rank, l.kept_dims, l.kept_strides);
    double acc = Identity(kind);
    for (int64_t r = begin + threadIdx.x; r < end; r += kThreads) {
      acc = Take(kind, acc, Widen(x[base + Offset(r, l.reduced_rank, l.reduced_dims, l.reduced_strides)]));
    }
    scratch[threadIdx.x] = acc;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) scratch[threadIdx.x] = Join(kind, scratch[threadIdx.x], scratch[threadIdx.x + half]);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      if (chunks == 1) {
        y[o] = Result(kind, scratch[0], scale);
      } else {
        partials[item] = scratch[0];
      }
    }
    __syncthreads();
  }
}

// Outputs whose last kept axis has stride 1: block (tile, range c) takes
// outputs tile * 32 + lane (threadIdx.x % 32) over reduced coordinates
// begin + row, begin + row + kRowLanes, ... of range c (row: threadIdx.x /
// 32), then adds the row lanes' sums in lane order. Writes as ReduceKernel.
constexpr int kRowLanes = kThreads / 32;
template <class T>
__global__ void ReduceColumnsKernel(int kind, const T* x, float* y, double* partials, int64_t outputs, int64_t reduced,
                                    int64_t chunks, ReduceLayout l, float scale) {
  __shared__ double scratch[kRowLanes][32];
  const int lane = static_cast<int>(threadIdx.x % 32), row = static_cast<int>(threadIdx.x / 32);
  const int64_t tiles = (outputs + 31) / 32, length = (reduced + chunks - 1) / chunks;
  for (int64_t item = blockIdx.x; item < tiles * chunks; item += gridDim.x) {
    const int64_t o = item / chunks * 32 + lane, c = item % chunks, begin = c * length;
    const int64_t end = begin + length < reduced ? begin + length : reduced;
    double acc = Identity(kind);
    if (o < outputs) {
      const int64_t base = Offset(o, l.kept_rank, l.kept_dims, l.kept_strides);
      for (int64_t r = begin + row; r < end; r += kRowLanes) {
        acc = Take(kind, acc, Widen(x[base + Offset(r, l.reduced_rank, l.reduced_dims, l.reduced_strides)]));
      }
    }
    scratch[row][lane] = acc;
    __syncthreads();
    if (row == 0 && o < outputs) {
      for (int i = 1; i < kRowLanes; ++i) acc = Join(kind, acc, scratch[i][lane]);
      if (chunks == 1) {
        y[o] = Result(kind, acc, scale);
      } else {
        partials[o * chunks + c] = acc;
      }
    }
    __syncthreads();
  }
}

// A warp per output o: lane i joins partials o * chunks + i, + i + 32, ...
// in order, then the lanes' results in a fixed tree; output o < split goes
// to y0[o], the rest to y1[o - split].
__global__ void CombineChunksKernel(int kind, const double* partials, int64_t outputs, int64_t chunks, float scale,
                                    float* y0, int64_t split, float* y1) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t o = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; o < outputs; o += warps) {
    double acc = Identity(kind);
    for (int64_t c = lane; c < chunks; c += 32) acc = Join(kind, acc, partials[o * chunks + c]);
    for (int offset = 16; offset > 0; offset /= 2) acc = Join(kind, acc, __shfl_xor_sync(0xffffffffu, acc, offset));
    if (lane == 0) {
      if (o < split) {
        y0[o] = Result(kind, acc, scale);
      } else {
        y1[o - split] = Result(kind, acc, scale);
      }
    }
  }
}

__global__ void ReduceMaxGradKernel(const float* x, const float* y, const float* dy, float* dx, int64_t outputs,
                                    int64_t reduced, ReduceLayout l) {
  __shared__ float scratch[kThreads];
  for (int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    const int64_t base = Offset(o, l.kept_rank, l.kept_dims, l.kept_strides);
    const float best = y[o];
    float ties = 0;
    for (int64_t r = threadIdx.x; r < reduced; r += kThreads) {
      ties += x[base + Offset(r, l.reduced_rank, l.reduced_dims, l.reduced_strides)] == best ? 1.0f : 0.0f;
    }
    scratch[threadIdx.x] = ties;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
      __syncthreads();
    }
    const float share = dy[o] / scratch[0];  // as the CPU's: dy / ties
    for (int64_t r = threadIdx.x; r < reduced; r += kThreads) {
      const int64_t at = base + Offset(r, l.reduced_rank, l.reduced_dims, l.reduced_strides);
      dx[at] = x[at] == best ? share : isnan(best) ? best : 0.0f;  // a NaN maximum: NaN, as the CPU's
    }
    __syncthreads();
  }
}

// A block's reduction of (value, index) pairs in shared memory to slot 0:
// the pair `better` prefers (better(v, i, best_v, best_i): whether (v, i)
// replaces the best so far). Every thread calls it; it ends synchronised.
template <typename Better>
__device__ void BlockBest(float* values, int64_t* indices, Better better) {
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float v = values[threadIdx.x + half];
      const int64_t i = indices[threadIdx.x + half];
      if (better(v, i, values[threadIdx.x], indices[threadIdx.x])) {
        values[threadIdx.x] = v;
        indices[threadIdx.x] = i;
      }
    }
    __syncthreads();
  }
}

__global__ void ArgmaxKernel(const float* x, int64_t* y, int64_t outputs, int64_t reduced, ReduceLayout l) {
  constexpr int64_t kNone = INT64_MAX;
  __shared__ float values[kThreads];
  __shared__ int64_t indices[kThreads];
  for (int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    const int64_t base = Offset(o, l.kept_rank, l.kept_dims, l.kept_strides);
    // The first of the greatest (NaN compares false: skipped); kNone loses
    // every tie, so -inf is a value.
    const auto better = [](float v, int64_t i, float best_v, int64_t best_i) {
      return v > best_v || (v == best_v && i < best_i);
    };
    float best = -INFINITY;
    int64_t index = kNone;
    for (int64_t r = threadIdx.x; r < reduced; r += kThreads) {
      const float v = x[base + r * l.reduced_strides[0]];
      if (better(v, r, best, index)) {
        best = v;
        index = r;
      }
    }
    values[threadIdx.x] = best;
    indices[threadIdx.x] = index;
    __syncthreads();
    BlockBest(values, indices, better);
    if (threadIdx.x == 0) y[o] = indices[0] == kNone ? 0 : indices[0];
    __syncthreads();
  }
}

// Whether element (va, a) of a row comes before (vb, b) in topk's order:
// descending by value, ties by lower index, NaN last (in index order), as
// the CPU's TopK.
__device__ inline bool Before(float va, int64_t a, float vb, int64_t b) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na || nb) return na == nb ? a < b : nb;
  return va > vb || (va == vb && a < b);
}

// One block per row: k rounds, each a block reduction for the first element
// (in Before's order) after the previous round's, so O(k n) per row: made
// for small k (sampling's top 40 of a vocabulary).
__global__ void TopKKernel(const float* x, float* values, int64_t* indices, int64_t rows, int64_t n, int64_t k) {
  __shared__ float best_values[kThreads];
  __shared__ int64_t best_indices[kThreads];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* in = x + row * n;
    float last_value = 0.0f;
    int64_t last_index = -1;  // none taken yet
    // Index -1: nothing found (yet).
    const auto better = [](float v, int64_t i, float best_v, int64_t best_i) {
      return i >= 0 && (best_i < 0 || Before(v, i, best_v, best_i));
    };
    for (int64_t j = 0; j < k; ++j) {
      float value = 0.0f;
      int64_t index = -1;
      for (int64_t r = threadIdx.x; r < n; r += kThreads) {
        const float v = in[r];
        if (last_index >= 0 && !Before(last_value, last_index, v, r)) continue;  // taken already
        if (better(v, r, value, index)) {
          value = v;
          index = r;
        }
      }
      best_values[threadIdx.x] = value;
      best_indices[threadIdx.x] = index;
      __syncthreads();
      BlockBest(best_values, best_indices, better);
      last_value = best_values[0];
      last_index = best_indices[0];
      if (threadIdx.x == 0) {
        values[row * k + j] = last_value;
        indices[row * k + j] = last_index;
      }
      __syncthreads();  // before the next round overwrites the winner
    }
  }
}

// Outputs and reduced coordinates of a layout.
void Counts(const ReduceLayout& layout, int64_t* outputs, int64_t* reduced) {
  *outputs = 1;
  *reduced = 1;
  for (int a = 0; a < layout.kept_rank; ++a) *outputs *= layout.kept_dims[a];
  for (int a = 0; a < layout.reduced_rank; ++a) *reduced *= layout.reduced_dims[a];
}

unsigned GridOf(int64_t outputs) { return static_cast<unsigned>(outputs < (1 << 20) ? outputs : (1 << 20)); }

}  // namespace

int LaunchReduceMaxGrad(const float* x, const float* y, const float* dy, float* dx, const ReduceLayout& layout) {
  int64_t outputs = 0, reduced = 0;
  Counts(layout, &outputs, &reduced);
  if (outputs == 0 || reduced == 0) return 0;
  ReduceMaxGradKernel<<<GridOf(outputs), kThreads, 0, CurrentStream()>>>(x, y, dy, dx, outputs, reduced, layout);
  return Finish();
}

int LaunchArgmax(const float* x, int64_t* y, const ReduceLayout& layout) {
  int64_t outputs = 0, reduced = 0;
  Counts(layout, &outputs, &reduced);
  if (outputs == 0) return 0;
  ArgmaxKernel<<<GridOf(outputs), kThreads, 0, CurrentStream()>>>(x, y, outputs, reduced, layout);
  return Finish();
}

int LaunchTopK(const float* x, float* values, int64_t* indices, int64_t rows, int64_t n, int64_t k) {
  if (rows == 0 || k == 0) return 0;
  TopKKernel<<<GridOf(rows), kThreads, 0, CurrentStream()>>>(x, values, indices, rows, n, k);
  return Finish();
}

int CombineChunks(int kind, const double* partials, int64_t outputs, int64_t chunks, float scale, float* y0,
                  int64_t split, float* y1, cudaStream_t stream) {
  const int64_t blocks = (outputs + kThreads / 32 - 1) / (kThreads / 32);
  CombineChunksKernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(
      kind, partials, outputs, chunks, scale, y0, split, y1);
  return static_cast<int>(cudaGetLastError());
}

namespace {

template <class T>
int LaunchReduceAs(int kind, const T* x, float* y, const ReduceLayout& layout, float scale, void* workspace,
                   size_t workspace_bytes) {
  int64_t outputs = 0, reduced = 0;
  Counts(layout, &outputs, &reduced);
  if (outputs == 0) return 0;
  const int64_t chunks = ReduceChunks(reduced);
  const cudaStream_t stream = CurrentStream();
  PartialsBuffer partials(workspace, workspace_bytes, chunks == 1 ? 0 : ReducePartialBytes(outputs, reduced), stream);
  if (partials.error() != 0) return partials.error();
  const bool columns = layout.kept_rank > 0 && layout.kept_strides[layout.kept_rank - 1] == 1 && reduced > 1;
  const int64_t items = (columns ? (outputs + 31) / 32 : outputs) * chunks;
  const auto grid = static_cast<unsigned>(items < (1 << 20) ? items : (1 << 20));
  if (columns) {
    ReduceColumnsKernel<T>
        <<<grid, kThreads, 0, stream>>>(kind, x, y, partials.get(), outputs, reduced, chunks, layout, scale);
  } else {
    ReduceKernel<T><<<grid, kThreads, 0, stream>>>(kind, x, y, partials.get(), outputs, reduced, chunks, layout, scale);
  }
  int err = static_cast<int>(cudaGetLastError());
  if (err == 0 && chunks > 1)
    err = CombineChunks(kind, partials.get(), outputs, chunks, scale, y, outputs, nullptr, stream);
  if (err != 0) return err;
  return Finish();
}

}  // namespace

int LaunchReduce(int kind, int x_dtype, const void* x, float* y, const ReduceLayout& layout, float scale,
                 void* workspace, size_t workspace_bytes) {
  if (x_dtype == 1) {
    return LaunchReduceAs(kind, static_cast<const __nv_bfloat16*>(x), y, layout, scale, workspace, workspace_bytes);
  }
  if (x_dtype == 2) {
    return LaunchReduceAs(kind, static_cast<const __half*>(x), y, layout, scale, workspace, workspace_bytes);
  }
  return LaunchReduceAs(kind, static_cast<const float*>(x), y, layout, scale, workspace, workspace_bytes);
}

}  // namespace tessera::ops::cuda
