// The data movement of the shape ops on CUDA: one strided copy kernel
// (ops/cuda/launch.h StridedCopy) and memset.

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

template <typename W>
__global__ void StridedCopyKernel(const W* src, W* dst, int64_t n, StridedCopy c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, s = c.src_base, d = c.dst_base;
    for (int a = c.rank - 1; a >= 0; --a) {
      const int64_t coord = rest % c.dims[a];
      rest /= c.dims[a];
      s += coord * c.src_strides[a];
      d += coord * c.dst_strides[a];
    }
    dst[d] = src[s];
  }
}

template <typename W>
int Launch(const void* src, void* dst, int64_t n, const StridedCopy& c) {
  StridedCopyKernel<W>
      <<<Blocks(n), kThreads, 0, CurrentStream()>>>(static_cast<const W*>(src), static_cast<W*>(dst), n, c);
  return Finish();
}

}  // namespace

int LaunchStridedCopy(const void* src, void* dst, const StridedCopy& copy) {
  int64_t n = 1;
  for (int a = 0; a < copy.rank; ++a) n *= copy.dims[a];
  if (n == 0) return 0;
  switch (copy.elem) {
    case 1:
      return Launch<uint8_t>(src, dst, n, copy);
    case 2:
      return Launch<uint16_t>(src, dst, n, copy);
    case 4:
      return Launch<uint32_t>(src, dst, n, copy);
    case 8:
      return Launch<uint64_t>(src, dst, n, copy);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

int Zero(void* dst, size_t bytes) {
  if (bytes == 0) return 0;
  const cudaError_t err = cudaMemsetAsync(dst, 0, bytes, CurrentStream());
  return err != cudaSuccess ? static_cast<int>(err) : Finish();
}

}  // namespace tessera::ops::cuda
