// CUDA dropout: the CPU's masks (ops/cpu/random.cc), one element per thread,
// drawn from core/philox.h's Philox4x32 (constexpr, so callable here).

#include <cuda_runtime.h>

#include <cstdint>

#include "core/philox.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

__global__ void DropoutKernel(const float* x, float* y, int64_t n, PhiloxKey key, uint32_t tensor_id, uint32_t step,
                              int32_t threshold, float scale, DropoutRuns runs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t run = p / runs.run_length;
    int64_t g = runs.base + p % runs.run_length;
    for (int axis = runs.outer_rank - 1; axis >= 0; --axis) {
      g += (run % runs.outer_local[axis]) * runs.outer_strides[axis];
      run /= runs.outer_local[axis];
    }
    const uint64_t block = static_cast<uint64_t>(g) / 4;
    const auto words =
        Philox4x32(key, static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), tensor_id, step);
    const bool keep = static_cast<int32_t>(words[static_cast<size_t>(g % 4)] >> 8) >= threshold;
    y[p] = x[p] * (keep ? scale : 0.0f);
  }
}

}  // namespace

int LaunchDropout(const float* x, float* y, int64_t n, uint64_t seed, uint32_t tensor_id, uint32_t step,
                  int32_t threshold, float scale, const DropoutRuns& runs) {
  if (n == 0) return 0;
  DropoutKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(x, y, n, MakePhiloxKey(seed), tensor_id, step,
                                                                 threshold, scale, runs);
  return Finish();
}

}  // namespace tessera::ops::cuda
