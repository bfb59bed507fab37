// matmul / batch_matmul through cuBLAS (cublasGemmStridedBatchedEx): the
// row-major product computed as its column-major transpose, y^T =
// op(b)^T op(a)^T, so no data moves. f32 compute without TF32, as the CPU.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

// One handle per thread and device, set to the thread's current stream
// (launch_util.cuh CurrentStream) at each use.
cublasHandle_t Handle(int* error) {
  constexpr int kMaxDevices = 64;
  thread_local cublasHandle_t handles[kMaxDevices] = {};
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    *error = static_cast<int>(err);
    return nullptr;
  }
  if (device < 0 || device >= kMaxDevices) {
    *error = static_cast<int>(cudaErrorInvalidDevice);
    return nullptr;
  }
  if (handles[device] == nullptr) {
    cublasHandle_t handle = nullptr;
    if (const cublasStatus_t st = cublasCreate(&handle); st != CUBLAS_STATUS_SUCCESS) {
      *error = -static_cast<int>(st);
      return nullptr;
    }
    cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH);  // no TF32: f32 products as the CPU's
    handles[device] = handle;
  }
  if (const cublasStatus_t st = cublasSetStream(handles[device], CurrentStream()); st != CUBLAS_STATUS_SUCCESS) {
    *error = -static_cast<int>(st);
    return nullptr;
  }
  return handles[device];
}

cudaDataType_t DataType(int code) { return code == 1 ? CUDA_R_16BF : code == 2 ? CUDA_R_16F : CUDA_R_32F; }

}  // namespace

int LaunchGemm(int a_dtype, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
               const void* a, const void* b, float* y) {
  if (batch == 0 || M == 0 || N == 0) return 0;
  if (K == 0) {  // an empty sum: zeros
    const cudaError_t err = cudaMemsetAsync(y, 0, sizeof(float) * batch * M * N, CurrentStream());
    return err != cudaSuccess ? static_cast<int>(err) : Finish();
  }
  int error = 0;
  cublasHandle_t handle = Handle(&error);
  if (handle == nullptr) return error;
  const float beta = 0.0f;
  const cudaDataType_t type = DataType(a_dtype);
  // Column-major: y^T (N x M, ld N) = op(b)^T (N x K) op(a)^T (K x M).
  const cublasStatus_t st = cublasGemmStridedBatchedEx(
      handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
      static_cast<int>(K), &alpha, b, type, static_cast<int>(tb ? K : N), K * N, a, type, static_cast<int>(ta ? M : K),
      M * K, &beta, y, CUDA_R_32F, static_cast<int>(N), M * N, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return -static_cast<int>(st);
  return Finish();
}

}  // namespace tessera::ops::cuda
