#pragma once
// Launch helpers of the .cu files (nvcc only).

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::ops::cuda {

inline constexpr int kThreads = 256;

// Blocks of kThreads for n elements: enough to fill the device, the kernels'
// grid-stride loops cover the rest.
inline unsigned Blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks < 1 ? 1 : blocks) : 65535);
}

// The launch's error, else the kernel's, after waiting for it on the
// thread's default stream.
inline int Finish() {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
  return static_cast<int>(err);
}

}  // namespace tessera::ops::cuda
