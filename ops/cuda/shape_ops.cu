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

namespace {

template <typename W>
__global__ void FillKernel(W* dst, int64_t n, W word) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = word;
  }
}

template <typename W>
__global__ void SelectKernel(const uint8_t* cond, const W* a, W a_word, const W* b, W* out, int64_t n,
                             SelectLayout l) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, c = 0, ai = 0, bi = 0;
    for (int d = l.rank - 1; d >= 0; --d) {
      const int64_t coord = rest % l.dims[d];
      rest /= l.dims[d];
      c += coord * l.cond_strides[d];
      ai += coord * l.a_strides[d];
      bi += coord * l.b_strides[d];
    }
    // Both operands read before the write: out may alias b (masked_fill in place).
    const W from_a = a == nullptr ? a_word : a[ai];
    const W from_b = b[bi];
    out[i] = cond[c] != 0 ? from_a : from_b;
  }
}

template <typename W>
int Fill(void* dst, int64_t n, uint64_t bits) {
  FillKernel<W><<<Blocks(n), kThreads, 0, CurrentStream()>>>(static_cast<W*>(dst), n, static_cast<W>(bits));
  return Finish();
}

template <typename W>
int Select(const uint8_t* cond, const void* a, uint64_t a_bits, const void* b, void* out, int64_t n,
           const SelectLayout& l) {
  SelectKernel<W><<<Blocks(n), kThreads, 0, CurrentStream()>>>(cond, static_cast<const W*>(a),
                                                                 static_cast<W>(a_bits), static_cast<const W*>(b),
                                                                 static_cast<W*>(out), n, l);
  return Finish();
}

}  // namespace

int LaunchFillBits(void* dst, int64_t n, int elem, uint64_t bits) {
  if (n == 0) return 0;
  switch (elem) {
    case 1:
      return Fill<uint8_t>(dst, n, bits);
    case 2:
      return Fill<uint16_t>(dst, n, bits);
    case 4:
      return Fill<uint32_t>(dst, n, bits);
    case 8:
      return Fill<uint64_t>(dst, n, bits);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

int LaunchSelect(const uint8_t* cond, const void* a, uint64_t a_bits, const void* b, void* out,
                 const SelectLayout& layout) {
  int64_t n = 1;
  for (int d = 0; d < layout.rank; ++d) n *= layout.dims[d];
  if (n == 0) return 0;
  switch (layout.elem) {
    case 1:
      return Select<uint8_t>(cond, a, a_bits, b, out, n, layout);
    case 2:
      return Select<uint16_t>(cond, a, a_bits, b, out, n, layout);
    case 4:
      return Select<uint32_t>(cond, a, a_bits, b, out, n, layout);
    case 8:
      return Select<uint64_t>(cond, a, a_bits, b, out, n, layout);
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
