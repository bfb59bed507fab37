// CUDA reductions (ops/cuda/launch.h LaunchReduce, LaunchReduceMaxGrad,
// LaunchArgmax, LaunchTopK): one block per output
// element, its threads striding over the reduced coordinates, then a block
// reduction in shared memory.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

__device__ int64_t Offset(int64_t index, int rank, const int64_t* dims, const int64_t* strides) {
  int64_t offset = 0;
  for (int a = rank - 1; a >= 0; --a) {
    offset += (index % dims[a]) * strides[a];
    index /= dims[a];
  }
  return offset;
}

__global__ void ReduceKernel(int kind, const float* x, float* y, int64_t outputs, int64_t reduced, ReduceLayout l,
                             float scale) {
  __shared__ double scratch[kThreads];
  for (int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    const int64_t base = Offset(o, l.kept_rank, l.kept_dims, l.kept_strides);
    double acc = kind == 1 ? -INFINITY : 0.0;
    for (int64_t r = threadIdx.x; r < reduced; r += kThreads) {
      const float v = x[base + Offset(r, l.reduced_rank, l.reduced_dims, l.reduced_strides)];
      if (kind == 1) {
        acc = fmax(acc, static_cast<double>(v));  // fmax skips NaN, as the CPU's max
      } else {
        acc += kind == 2 ? static_cast<double>(v) * v : static_cast<double>(v);
      }
    }
    scratch[threadIdx.x] = acc;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) {
        scratch[threadIdx.x] = kind == 1 ? fmax(scratch[threadIdx.x], scratch[threadIdx.x + half])
                                         : scratch[threadIdx.x] + scratch[threadIdx.x + half];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      y[o] = kind == 1 ? static_cast<float>(scratch[0]) : static_cast<float>(scratch[0]) * scale;
    }
    __syncthreads();
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
      dx[at] = x[at] == best ? share : 0.0f;
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

int LaunchReduce(int kind, const float* x, float* y, const ReduceLayout& layout, float scale) {
  int64_t outputs = 0, reduced = 0;
  Counts(layout, &outputs, &reduced);
  if (outputs == 0) return 0;
  ReduceKernel<<<GridOf(outputs), kThreads, 0, CurrentStream()>>>(kind, x, y, outputs, reduced, layout, scale);
  return Finish();
}

}  // namespace tessera::ops::cuda
