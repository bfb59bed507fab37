// CUDA element-wise kernels: the math of ops/cpu/elementwise.cc (same
// formulas, so results agree to float rounding), grid-stride loops over
// contiguous floats. Launchers: ops/cuda/launch.h.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"
#include "ops/gelu_formulas.h"

namespace tessera::ops::cuda {
namespace {

// The CPU kernels' enums, by value (ops/cpu/elementwise.h).
enum Binary { kAdd, kSub, kMul, kDiv };
enum Unary { kNeg, kExp, kLog, kSqrt, kRsqrt, kTanh, kRelu, kSilu, kGelu, kGeluTanh, kAbs };
enum Scalar { kScalarAdd, kScalarMul, kScalarPow };
enum ActivationGrad { kReluFromY, kTanhFromY, kSiluFromX, kGeluFromX, kGeluTanhFromX, kAbsFromX };

__device__ inline float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// CUDA's functions for the shared GELU formulas (ops/gelu_formulas.h).
struct CudaMath {
  __host__ __device__ static float Exp(float x) { return expf(x); }
  __host__ __device__ static float Erf(float x) { return erff(x); }
  __host__ __device__ static float Tanh(float x) { return tanhf(x); }
};
__device__ inline float Gelu(float x, bool tanh_approx) { return GeluOf<CudaMath>(x, tanh_approx); }
__device__ inline float GeluGrad(float x, bool tanh_approx) { return GeluGradOf<CudaMath>(x, tanh_approx); }

__device__ inline float ApplyBinary(int kind, float a, float b) {
  switch (kind) {
    case kAdd:
      return a + b;
    case kSub:
      return a - b;
    case kMul:
      return a * b;
    default:
      return a / b;
  }
}

__device__ inline float ApplyUnary(int kind, float x) {
  switch (kind) {
    case kNeg:
      return -x;
    case kExp:
      return expf(x);
    case kLog:
      return logf(x);
    case kSqrt:
      return sqrtf(x);
    case kRsqrt:
      return 1.0f / sqrtf(x);
    case kTanh:
      return tanhf(x);
    case kRelu:
      return x > 0.0f || x != x ? x : 0.0f;  // NaN stays NaN (the CPU kernel's, PyTorch's)
    case kSilu:
      return x * Sigmoid(x);
    case kGelu:
      return Gelu(x, false);
    case kAbs:
      return fabsf(x);
    default:
      return Gelu(x, true);
  }
}

__device__ inline float ApplyActivationGrad(int kind, float z, float dy) {
  switch (kind) {
    case kReluFromY:
      return z > 0.0f ? dy : 0.0f;
    case kTanhFromY:
      return dy * (1.0f - z * z);
    case kSiluFromX: {
      const float s = Sigmoid(z);
      return dy * s * (1.0f + z * (1.0f - s));
    }
    case kGeluFromX:
      return dy * GeluGrad(z, false);
    case kAbsFromX:
      return z > 0.0f ? dy : z < 0.0f ? -dy : 0.0f;
    default:
      return dy * GeluGrad(z, true);
  }
}

__global__ void BinaryKernel(int kind, const float* a, const float* b, float* y, int64_t n, Broadcast shape) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, ia = 0, ib = 0;
    for (int d = shape.rank - 1; d >= 0; --d) {
      const int64_t c = rest % shape.dims[d];
      rest /= shape.dims[d];
      ia += c * shape.a_strides[d];
      ib += c * shape.b_strides[d];
    }
    y[i] = ApplyBinary(kind, a[ia], b[ib]);
  }
}

__global__ void UnaryKernel(int kind, const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = ApplyUnary(kind, x[i]);
  }
}

__global__ void ScalarKernel(int kind, const float* x, float* y, int64_t n, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = kind == kScalarAdd ? v + value : kind == kScalarMul ? v * value : value == 2.0f ? v * v : powf(v, value);
  }
}

__global__ void ActivationGradKernel(int kind, const float* z, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dx[i] = ApplyActivationGrad(kind, z[i], dy[i]);
  }
}

__global__ void BiasAddKernel(const float* x, const float* bias, float* y, int64_t n, int64_t C, int gelu) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float h = x[i] + bias[i % C];
    y[i] = gelu == 0 ? h : Gelu(h, gelu == 2);
  }
}

__global__ void BiasGeluGradKernel(const float* x, const float* bias, const float* dy, float* dx, int64_t n, int64_t C,
                                   bool tanh_approx) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dx[i] = dy[i] * GeluGrad(x[i] + bias[i % C], tanh_approx);
  }
}

}  // namespace

int LaunchBiasGeluGrad(const float* x, const float* bias, const float* dy, float* dx, int64_t rows, int64_t C,
                       bool tanh) {
  const int64_t n = rows * C;
  if (n == 0) return 0;
  BiasGeluGradKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(x, bias, dy, dx, n, C, tanh);
  return Finish();
}

int LaunchBinary(int kind, const float* a, const float* b, float* y, int64_t n, const Broadcast& shape) {
  if (n == 0) return 0;
  BinaryKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(kind, a, b, y, n, shape);
  return Finish();
}

int LaunchUnary(int kind, const float* x, float* y, int64_t n) {
  if (n == 0) return 0;
  UnaryKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(kind, x, y, n);
  return Finish();
}

int LaunchScalar(int kind, const float* x, float* y, int64_t n, float value) {
  if (n == 0) return 0;
  ScalarKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(kind, x, y, n, value);
  return Finish();
}

int LaunchActivationGrad(int kind, const float* z, const float* dy, float* dx, int64_t n) {
  if (n == 0) return 0;
  ActivationGradKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(kind, z, dy, dx, n);
  return Finish();
}

int LaunchBiasAdd(const float* x, const float* bias, float* y, int64_t rows, int64_t C, int gelu) {
  const int64_t n = rows * C;
  if (n == 0) return 0;
  BiasAddKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(x, bias, y, n, C, gelu);
  return Finish();
}

int DeviceCount(int* count) {
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) *count = 0;
  return static_cast<int>(err);
}

int SetDevice(int device) { return static_cast<int>(cudaSetDevice(device)); }

int LaunchHostFunc(void* stream, void (*fn)(void*), void* data) {
  return static_cast<int>(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), fn, data));
}

namespace {
thread_local cudaStream_t bound_stream = nullptr;
thread_local bool stream_bound = false;
}  // namespace

void BindStream(void* stream) {
  bound_stream = static_cast<cudaStream_t>(stream);
  stream_bound = stream != nullptr;
}
cudaStream_t CurrentStream() { return stream_bound ? bound_stream : cudaStreamPerThread; }
bool StreamBound() { return stream_bound; }

int CopyOnStream(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return 0;
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CurrentStream());
  return err != cudaSuccess ? static_cast<int>(err) : Finish();
}

int Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return 0;
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, CurrentStream());
  if (err == cudaSuccess) err = cudaStreamSynchronize(CurrentStream());
  return static_cast<int>(err);
}

int CopyReady(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return 0;
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamPerThread);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
  return static_cast<int>(err);
}

const char* ErrorString(int code) {
  if (code < 0) return cublasGetStatusString(static_cast<cublasStatus_t>(-code));
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace tessera::ops::cuda
