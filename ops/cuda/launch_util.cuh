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

// `bytes` of device memory for a kernel's partial results: the workspace
// the plan gave the act when it holds them, else memory ordered on
// `stream` (cudaMallocAsync: cudaMalloc would wait for the whole device),
// freed on it when this goes (after the kernels queued with it).
class PartialsBuffer {
 public:
  PartialsBuffer(void* workspace, size_t workspace_bytes, int64_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes <= 0) return;
    if (workspace != nullptr && workspace_bytes >= static_cast<size_t>(bytes)) {
      data_ = workspace;
      return;
    }
    const cudaError_t err = cudaMallocAsync(&data_, static_cast<size_t>(bytes), stream);
    error_ = static_cast<int>(err);
    own_ = err == cudaSuccess;
  }
  ~PartialsBuffer() {
    if (own_) cudaFreeAsync(data_, stream_);
  }
  PartialsBuffer(const PartialsBuffer&) = delete;
  PartialsBuffer& operator=(const PartialsBuffer&) = delete;
  double* get() const { return static_cast<double*>(data_); }
  int error() const { return error_; }

 private:
  cudaStream_t stream_;
  void* data_ = nullptr;
  bool own_ = false;
  int error_ = 0;
};

// y0[o] for o < split, else y1[o - split], = scale · the `chunks` double
// partials of output o (partials[o * chunks + c]) joined in a fixed order:
// summed, or their max for kind 1 (scale unused). Queued on `stream`;
// returns the launch's error (ops/cuda/reduce.cu).
int CombineChunks(int kind, const double* partials, int64_t outputs, int64_t chunks, float scale, float* y0,
                  int64_t split, float* y1, cudaStream_t stream);

}  // namespace tessera::ops::cuda
