#pragma once
// Device helpers of the fused attention kernels (attention.cu: f32 on CUDA
// cores; attention_tc.cu: bf16 / f16 on tensor cores): which keys a query
// sees, the dropout mask of a probability, warp reductions.

#include <cuda_runtime.h>

#include <array>
#include <cmath>

#include "core/philox.h"
#include "ops/attention_shape.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda::attention {

__device__ inline float WarpMax(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ inline float WarpSum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ inline bool Visible(const AttentionShape& a, int64_t b, int64_t t, int64_t s) {
  if (s >= a.keys) return false;
  if (a.causal && s > t + a.causal_shift) return false;
  return a.mask == nullptr || a.mask[b * a.keys + s] != 0;
}

// The dropout mask value of probability (b, h, t, s) (local): the dropout
// op's for that global index (ops/attention_shape.h); 1 without dropout.
__device__ inline float Keep(const AttentionShape& a, int64_t b, int64_t h, int64_t t, int64_t s) {
  if (a.dropout_rate <= 0.0f) return 1.0f;
  const auto g = static_cast<uint64_t>(a.ProbabilityIndex(b, h, t, s));
  const uint64_t block = g / 4;
  const PhiloxKey key{static_cast<uint32_t>(a.dropout_seed),
                      static_cast<uint32_t>(a.dropout_seed >> 32)};  // MakePhiloxKey's
  const auto w = Philox4x32(key, static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), a.tensor_id, a.step);
  return static_cast<int32_t>(w[g % 4] >> 8) >= a.dropout_threshold ? a.dropout_scale : 0.0f;
}

// The Philox words of the block of four probabilities that starts at local
// (b, h, t, s) (its global index a multiple of 4), and a word's dropout
// multiplier: what Keep draws for each of the four, one draw for all.
__device__ inline std::array<uint32_t, 4> KeepWords(const AttentionShape& a, int64_t b, int64_t h, int64_t t,
                                                    int64_t s) {
  const uint64_t block = static_cast<uint64_t>(a.ProbabilityIndex(b, h, t, s)) / 4;
  const PhiloxKey key{static_cast<uint32_t>(a.dropout_seed), static_cast<uint32_t>(a.dropout_seed >> 32)};
  return Philox4x32(key, static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), a.tensor_id, a.step);
}
__device__ inline float KeepOf(const AttentionShape& a, uint32_t word) {
  return static_cast<int32_t>(word >> 8) >= a.dropout_threshold ? a.dropout_scale : 0.0f;
}

// The keys [0, end) some query of [t0, t0 + rows) may see.
__device__ inline int64_t KeyEnd(const AttentionShape& a, int64_t t0, int64_t rows) {
  if (!a.causal) return a.keys;
  const int64_t end = t0 + rows + a.causal_shift;
  return end < 0 ? 0 : (end > a.keys ? a.keys : end);
}

// The gradient launchers' frame: with keys but no query dk and dv (of
// `elem_bytes` values) are zeros; else `launch(delta)` queues the kernels
// (returning cudaGetLastError's code) with the B·H·T floats of `delta`:
// the workspace's, or stream-ordered memory when it is null.
template <class Launch>
int WithDelta(const AttentionShape& shape, size_t elem_bytes, void* dk, void* dv, float* delta, Launch launch) {
  const int64_t BH = shape.batch * shape.heads;
  const cudaStream_t stream = CurrentStream();
  if (BH * shape.keys > 0 && shape.queries == 0) {
    const size_t bytes = static_cast<size_t>(BH * shape.keys * shape.head_dim) * elem_bytes;
    cudaMemsetAsync(dk, 0, bytes, stream);
    cudaMemsetAsync(dv, 0, bytes, stream);
    return Finish();
  }
  if (BH * shape.queries == 0) return 0;
  const bool own = delta == nullptr;
  if (own) {
    const cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&delta),
                                            static_cast<size_t>(BH * shape.queries) * sizeof(float), stream);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  const int launched = launch(delta);
  if (own) cudaFreeAsync(delta, stream);
  return launched != 0 ? launched : Finish();
}

}  // namespace tessera::ops::cuda::attention
