// CUDA dropout, uniform and normal: the CPU's Philox words (ops/cpu/random.cc),
// one element per thread, drawn from core/philox.h's Philox4x32 (constexpr,
// so callable here).

#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "core/philox.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

// The global index of the shard's element p.
__device__ inline int64_t GlobalIndex(int64_t p, const RandomRuns& runs) {
  int64_t run = p / runs.run_length;
  int64_t g = runs.base + p % runs.run_length;
  for (int axis = runs.outer_rank - 1; axis >= 0; --axis) {
    g += (run % runs.outer_local[axis]) * runs.outer_strides[axis];
    run /= runs.outer_local[axis];
  }
  return g;
}

// Philox block g / 4 of the stream.
__device__ inline std::array<uint32_t, 4> BlockOf(int64_t g, const PhiloxKey& key, uint32_t tensor_id, uint32_t step) {
  const uint64_t block = static_cast<uint64_t>(g) / 4;
  return Philox4x32(key, static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), tensor_id, step);
}

// The 24 high bits of a word, as the CPU's High24.
__device__ inline float High24(uint32_t bits) { return static_cast<float>(static_cast<int32_t>(bits >> 8)); }

constexpr float kTwoToMinus24 = 1.0f / 16777216.0f;

__global__ void DropoutKernel(const float* x, float* y, int64_t n, PhiloxKey key, uint32_t tensor_id, uint32_t step,
                              int32_t threshold, float scale, RandomRuns runs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = GlobalIndex(p, runs);
    const auto words = BlockOf(g, key, tensor_id, step);
    const bool keep = static_cast<int32_t>(words[static_cast<size_t>(g % 4)] >> 8) >= threshold;
    y[p] = x[p] * (keep ? scale : 0.0f);
  }
}

__global__ void BiasDropoutAddKernel(const float* x, const float* bias, const float* residual, float* y, int64_t n,
                                     int64_t C, bool drop, PhiloxKey key, uint32_t tensor_id, uint32_t step,
                                     int32_t threshold, float scale, RandomRuns runs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float t = __fadd_rn(x[p], bias[p % C]);
    if (drop) {
      const int64_t g = GlobalIndex(p, runs);
      const auto words = BlockOf(g, key, tensor_id, step);
      const bool keep = static_cast<int32_t>(words[static_cast<size_t>(g % 4)] >> 8) >= threshold;
      t = __fmul_rn(t, keep ? scale : 0.0f);
    }
    y[p] = __fadd_rn(residual[p], t);
  }
}

__global__ void UniformKernel(float* y, int64_t n, PhiloxKey key, uint32_t tensor_id, uint32_t step, float low,
                              float span, float below_high, RandomRuns runs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = GlobalIndex(p, runs);
    const auto words = BlockOf(g, key, tensor_id, step);
    const float u = High24(words[static_cast<size_t>(g % 4)]) * kTwoToMinus24;
    y[p] = fminf(low + span * u, below_high);
  }
}

__global__ void NormalKernel(float* y, int64_t n, PhiloxKey key, uint32_t tensor_id, uint32_t step, float mean,
                             float stddev, RandomRuns runs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = GlobalIndex(p, runs);
    const auto words = BlockOf(g, key, tensor_id, step);
    const auto lane = static_cast<size_t>(g % 4);
    const size_t pair = lane / 2 * 2;
    const float u1 = (High24(words[pair]) + 1.0f) * kTwoToMinus24;  // (0, 1]: the log stays finite
    const float u2 = High24(words[pair + 1]) * kTwoToMinus24;
    const float radius = stddev * sqrtf(-2.0f * logf(u1));
    float sin_t = 0.0f, cos_t = 0.0f;
    sincospif(2.0f * u2, &sin_t, &cos_t);
    y[p] = mean + radius * (lane % 2 == 0 ? cos_t : sin_t);
  }
}

}  // namespace

int LaunchDropout(const float* x, float* y, int64_t n, uint64_t seed, uint32_t tensor_id, uint32_t step,
                  int32_t threshold, float scale, const RandomRuns& runs) {
  if (n == 0) return 0;
  DropoutKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(x, y, n, MakePhiloxKey(seed), tensor_id, step,
                                                                 threshold, scale, runs);
  return Finish();
}

int LaunchBiasDropoutAdd(const float* x, const float* bias, const float* residual, float* y, int64_t n, int64_t C,
                         bool drop, uint64_t seed, uint32_t tensor_id, uint32_t step, int32_t threshold, float scale,
                         const RandomRuns& runs) {
  if (n == 0) return 0;
  BiasDropoutAddKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(
      x, bias, residual, y, n, C, drop, MakePhiloxKey(seed), tensor_id, step, threshold, scale, runs);
  return Finish();
}

int LaunchUniform(float* y, int64_t n, uint64_t seed, uint32_t tensor_id, uint32_t step, float low, float span,
                  float below_high, const RandomRuns& runs) {
  if (n == 0) return 0;
  UniformKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(y, n, MakePhiloxKey(seed), tensor_id, step, low, span,
                                                             below_high, runs);
  return Finish();
}

int LaunchNormal(float* y, int64_t n, uint64_t seed, uint32_t tensor_id, uint32_t step, float mean, float stddev,
                 const RandomRuns& runs) {
  if (n == 0) return 0;
  NormalKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(y, n, MakePhiloxKey(seed), tensor_id, step, mean, stddev,
                                                            runs);
  return Finish();
}

}  // namespace tessera::ops::cuda
