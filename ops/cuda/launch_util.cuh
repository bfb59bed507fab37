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

// The stream this thread's launches go on: the one BindStream (launch.h)
// bound, else the thread's default stream.
cudaStream_t CurrentStream();
// Whether BindStream bound one (then launchers do not wait).
bool StreamBound();

// The launch's error; on the thread's default stream also the kernel's,
// after waiting for it. On a bound stream the kernel runs on after this
// returns: its errors reach the stream's completion callback.
inline int Finish() {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess && !StreamBound()) err = cudaStreamSynchronize(cudaStreamPerThread);
  return static_cast<int>(err);
}

}  // namespace tessera::ops::cuda
