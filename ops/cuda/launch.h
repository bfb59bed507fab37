#pragma once
// Launchers of the CUDA element-wise kernels (ops/cuda/elementwise.cu), in
// plain C++ so that host code includes them without the CUDA headers, and
// the few runtime calls the host side needs. Every launcher runs on the
// calling thread's default stream (cudaStreamPerThread) and waits for the
// kernel (acts are synchronous until the asynchronous stream model exists),
// and returns a cudaError_t as an int: 0 is success, ErrorString names it.
// Kinds are the CPU kernels' enums (ops/cpu/elementwise.h) as ints.

#include <cstddef>
#include <cstdint>

namespace tessera::ops::cuda {

inline constexpr int kMaxRank = 8;

// Output dims and each input's strides over them (0 where it broadcasts).
struct Broadcast {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t a_strides[kMaxRank] = {};
  int64_t b_strides[kMaxRank] = {};
};

int LaunchBinary(int kind, const float* a, const float* b, float* y, int64_t n, const Broadcast& shape);
int LaunchUnary(int kind, const float* x, float* y, int64_t n);
int LaunchScalar(int kind, const float* x, float* y, int64_t n, float value);
int LaunchActivationGrad(int kind, const float* z, const float* dy, float* dx, int64_t n);
// y = x + bias over rows of C, then GELU: gelu 0 none, 1 exact (erf), 2 tanh.
int LaunchBiasAdd(const float* x, const float* bias, float* y, int64_t rows, int64_t C, int gelu);

// The visible CUDA devices (0 with an error code when the driver has none).
int DeviceCount(int* count);
// Makes `device` current on the calling thread.
int SetDevice(int device);
// Copies `bytes` between any two pointers (host or device), then waits.
int Copy(void* dst, const void* src, size_t bytes);
const char* ErrorString(int code);

}  // namespace tessera::ops::cuda
