// matmul / batch_matmul through cuBLAS (cublasGemmStridedBatchedEx), and
// matmul_bias_gelu's GEMM with its bias + GELU epilogue through cuBLASLt:
// the row-major product computed as its column-major transpose, y^T =
// op(b)^T op(a)^T, so no data moves. f32 compute without TF32, as the CPU.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

constexpr int kMaxDevices = 64;

// The calling thread's current device, or -1 with *error set.
int CurrentDevice(int* error) {
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    *error = static_cast<int>(err);
    return -1;
  }
  if (device < 0 || device >= kMaxDevices) {
    *error = static_cast<int>(cudaErrorInvalidDevice);
    return -1;
  }
  return device;
}

// One handle per thread and device, set to the thread's current stream
// (launch_util.cuh CurrentStream) at each use.
cublasHandle_t Handle(int* error) {
  thread_local cublasHandle_t handles[kMaxDevices] = {};
  const int device = CurrentDevice(error);
  if (device < 0) return nullptr;
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

// One cuBLASLt handle per thread and device (cuBLASLt handles carry no
// stream: the stream is an argument of each cublasLtMatmul).
cublasLtHandle_t LtHandle(int* error) {
  thread_local cublasLtHandle_t handles[kMaxDevices] = {};
  const int device = CurrentDevice(error);
  if (device < 0) return nullptr;
  if (handles[device] == nullptr) {
    if (const cublasStatus_t st = cublasLtCreate(&handles[device]); st != CUBLAS_STATUS_SUCCESS) {
      handles[device] = nullptr;
      *error = -static_cast<int>(st);
      return nullptr;
    }
  }
  return handles[device];
}

// The largest power of two (up to 256) dividing the address: what the
// heuristic may assume of a buffer's alignment (it assumes 256 otherwise).
uint32_t AlignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// The descriptors of one cublasLtMatmul, destroyed with it.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~LtDescriptors() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

#define TESSERA_LT_TRY(call)                                                                            \
  do {                                                                                                  \
    if (const cublasStatus_t st_ = (call); st_ != CUBLAS_STATUS_SUCCESS) return -static_cast<int>(st_); \
  } while (0)

}  // namespace

int LaunchGemmBiasLt(int x_dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, const float* bias,
                     float* z, float* y, void* workspace, size_t workspace_bytes, bool* fused) {
  *fused = false;
  // GELU's auxiliary output needs a leading dimension divisible by 8.
  if (M == 0 || N == 0 || K == 0 || (y != nullptr && N % 8 != 0)) return 0;
  int error = 0;
  cublasLtHandle_t handle = LtHandle(&error);
  if (handle == nullptr) return error;
  const cudaDataType_t type = DataType(x_dtype);
  LtDescriptors desc;
  TESSERA_LT_TRY(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));  // no TF32, as matmul
  const bool gelu = y != nullptr;
  const cublasLtEpilogue_t epilogue = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
  TESSERA_LT_TRY(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  // The bias and the auxiliary output take D's type, f32 (their defaults).
  TESSERA_LT_TRY(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  float* d = z;  // the matmul's output: z, or y with z as GELU's auxiliary output
  if (gelu) {
    const int64_t aux_ld = N;
    TESSERA_LT_TRY(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &z, sizeof(z)));
    TESSERA_LT_TRY(
        cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    d = y;
  }
  // Column-major: y^T (N x M, ld N) = w^T (N x K, ld N) x^T (K x M, ld K);
  // the bias runs along y^T's rows, its N.
  TESSERA_LT_TRY(cublasLtMatrixLayoutCreate(&desc.a, type, static_cast<uint64_t>(N), static_cast<uint64_t>(K), N));
  TESSERA_LT_TRY(cublasLtMatrixLayoutCreate(&desc.b, type, static_cast<uint64_t>(K), static_cast<uint64_t>(M), K));
  TESSERA_LT_TRY(
      cublasLtMatrixLayoutCreate(&desc.d, CUDA_R_32F, static_cast<uint64_t>(N), static_cast<uint64_t>(M), N));
  TESSERA_LT_TRY(cublasLtMatmulPreferenceCreate(&desc.preference));
  // The workspace from its first 256-byte boundary on.
  uint64_t workspace_size = 0;
  if (workspace != nullptr) {
    const auto address = reinterpret_cast<uintptr_t>(workspace);
    const uintptr_t skip = (256 - address % 256) % 256;
    if (workspace_bytes > skip) {
      workspace = reinterpret_cast<void*>(address + skip);
      workspace_size = workspace_bytes - skip;
    }
  }
  if (workspace_size == 0) workspace = nullptr;
  TESSERA_LT_TRY(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_size, sizeof(workspace_size)));
  for (const auto& [attribute, pointer] :
       {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, w},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, x},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<const void*>(d)},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<const void*>(d)}}) {
    const uint32_t alignment = AlignmentOf(pointer);
    TESSERA_LT_TRY(cublasLtMatmulPreferenceSetAttribute(desc.preference, attribute, &alignment, sizeof(alignment)));
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d,
                                                                  desc.preference, 1, &result, &found);
  // No kernel for this epilogue, type and alignment: the caller composes it.
  if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED || (heuristic == CUBLAS_STATUS_SUCCESS && found == 0)) return 0;
  TESSERA_LT_TRY(heuristic);
  const float alpha = 1.0f, beta = 0.0f;
  TESSERA_LT_TRY(cublasLtMatmul(handle, desc.op, &alpha, w, desc.a, x, desc.b, &beta, d, desc.d, d, desc.d,
                                &result.algo, workspace, workspace_size, CurrentStream()));
  *fused = true;
  return Finish();
}

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
