// CUDA reductions (ops/cuda/launch.h LaunchReduce): one block per output
// element, its threads striding over the reduced coordinates, then a block
// reduction in shared memory.

#include <cuda_runtime.h>

#include <cmath>

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

}  // namespace

int LaunchReduce(int kind, const float* x, float* y, const ReduceLayout& layout, float scale) {
  int64_t outputs = 1, reduced = 1;
  for (int a = 0; a < layout.kept_rank; ++a) outputs *= layout.kept_dims[a];
  for (int a = 0; a < layout.reduced_rank; ++a) reduced *= layout.reduced_dims[a];
  if (outputs == 0) return 0;
  const unsigned blocks = static_cast<unsigned>(outputs < (1 << 20) ? outputs : (1 << 20));
  ReduceKernel<<<blocks, kThreads, 0, CurrentStream()>>>(kind, x, y, outputs, reduced, layout, scale);
  return Finish();
}

}  // namespace tessera::ops::cuda
