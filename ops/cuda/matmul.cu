// matmul / batch_matmul and matmul_bias_gelu's GEMM with its bias + GELU
// epilogue through cuBLASLt (cuBLAS's cublasGemmStridedBatchedEx where
// cuBLASLt has no algorithm for a plain product): the row-major product
// computed as its column-major transpose, y^T = op(b)^T op(a)^T, so no data
// moves. f32 compute without TF32, as the CPU.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

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

// cuBLAS and cuBLASLt handles: one per thread and device, taken from a
// per-device pool at the thread's first use and given back when the thread
// exits. A process that runs job after job on fresh threads (a worker
// daemon) so holds as many handles as it ever had threads using a GPU at
// once, not one per thread it ever ran (each holds device workspace), and
// never destroys one (cublasDestroy waits for the whole device, a
// collective waiting for its peers included).
template <class H>
class HandlePool {
 public:
  H Take(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<H>& free = free_[static_cast<size_t>(device)];
    if (free.empty()) return nullptr;
    const H h = free.back();
    free.pop_back();
    return h;
  }
  void Give(int device, H h) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[static_cast<size_t>(device)].push_back(h);
  }
  void Made(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    ++made_[static_cast<size_t>(device)];
  }
  int made(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    return made_[static_cast<size_t>(device)];
  }

 private:
  std::mutex mu_;
  std::array<std::vector<H>, kMaxDevices> free_;
  std::array<int, kMaxDevices> made_ = {};
};

// Never destroyed: threads may give their handles back during static
// destruction.
HandlePool<cublasHandle_t>& BlasPool() {
  static auto* pool = new HandlePool<cublasHandle_t>;
  return *pool;
}
HandlePool<cublasLtHandle_t>& LtPool() {
  static auto* pool = new HandlePool<cublasLtHandle_t>;
  return *pool;
}

struct ThreadHandles {
  std::array<cublasHandle_t, kMaxDevices> blas = {};
  std::array<cublasLtHandle_t, kMaxDevices> lt = {};
  ~ThreadHandles() {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (blas[static_cast<size_t>(d)] != nullptr) BlasPool().Give(d, blas[static_cast<size_t>(d)]);
      if (lt[static_cast<size_t>(d)] != nullptr) LtPool().Give(d, lt[static_cast<size_t>(d)]);
    }
  }
};
thread_local ThreadHandles thread_handles;

// The calling thread's cuBLAS handle for its current device, set to the
// thread's current stream (launch_util.cuh CurrentStream) at each use.
cublasHandle_t Handle(int* error) {
  const int device = CurrentDevice(error);
  if (device < 0) return nullptr;
  cublasHandle_t& handle = thread_handles.blas[static_cast<size_t>(device)];
  if (handle == nullptr) handle = BlasPool().Take(device);
  if (handle == nullptr) {
    cublasHandle_t made = nullptr;
    if (const cublasStatus_t st = cublasCreate(&made); st != CUBLAS_STATUS_SUCCESS) {
      *error = -static_cast<int>(st);
      return nullptr;
    }
    cublasSetMathMode(made, CUBLAS_PEDANTIC_MATH);  // no TF32: f32 products as the CPU's
    BlasPool().Made(device);
    handle = made;
  }
  if (const cublasStatus_t st = cublasSetStream(handle, CurrentStream()); st != CUBLAS_STATUS_SUCCESS) {
    *error = -static_cast<int>(st);
    return nullptr;
  }
  return handle;
}

cudaDataType_t DataType(int code) { return code == 1 ? CUDA_R_16BF : code == 2 ? CUDA_R_16F : CUDA_R_32F; }

// The calling thread's cuBLASLt handle for its current device (cuBLASLt
// handles carry no stream: the stream is an argument of each
// cublasLtMatmul).
cublasLtHandle_t LtHandle(int* error) {
  const int device = CurrentDevice(error);
  if (device < 0) return nullptr;
  cublasLtHandle_t& handle = thread_handles.lt[static_cast<size_t>(device)];
  if (handle == nullptr) handle = LtPool().Take(device);
  if (handle == nullptr) {
    cublasLtHandle_t made = nullptr;
    if (const cublasStatus_t st = cublasLtCreate(&made); st != CUBLAS_STATUS_SUCCESS) {
      *error = -static_cast<int>(st);
      return nullptr;
    }
    LtPool().Made(device);
    handle = made;
  }
  return handle;
}

// The largest power of two (up to 256) dividing the address and, for a
// batch, each matrix's offset (stride_bytes; 0: one matrix): what the
// heuristic may assume of a buffer's alignment (it assumes 256 otherwise).
uint32_t AlignmentOf(const void* p, uint64_t stride_bytes = 0) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && (address % alignment != 0 || stride_bytes % alignment != 0)) alignment /= 2;
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

// One row-major product for cublasLtMatmul: d (batch x M x N, f32) = alpha
// · op(a) op(b), a (M x K, or K x M when ta) and b (K x N, or N x K when
// tb) per batch of `dtype` (0 f32, 1 bf16, 2 f16), with an optional
// epilogue: the bias (N) along d's rows, GELU with z = the product + bias
// as its auxiliary output (ld N). Computed as its column-major transpose,
// d^T (N x M, ld N) = op(b)^T op(a)^T, so no data moves; f32 compute, no
// TF32.
struct LtProduct {
  int dtype = 0;
  bool ta = false, tb = false;
  int64_t batch = 1, M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const void* a = nullptr;
  const void* b = nullptr;
  float* d = nullptr;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const float* bias = nullptr;
  float* aux = nullptr;
  const float* c = nullptr;  // added to the product (beta 1), laid out as d; null: none
};

// What the heuristic's answer for a product depends on: the handle (a
// thread's, per device), the types, transposes, extents, epilogue, whether
// C is added, the alignments of A, B, C, D and the workspace.
using LtKey = std::array<int64_t, 16>;
constexpr size_t kMaxKnownProducts = 4096;  // per thread; forgotten all at once past it

// Runs `p` (every extent > 0) on the calling thread's stream with up to
// `workspace_bytes` at `workspace` (null: none; aligned up to 256 bytes
// here). *ran is false, and nothing written, when cuBLASLt has no
// algorithm for it (types, epilogue, alignments); a cuBLASLt error returns
// -(cublasStatus_t).
int RunLt(const LtProduct& p, void* workspace, size_t workspace_bytes, bool* ran) {
  *ran = false;
  int error = 0;
  cublasLtHandle_t handle = LtHandle(&error);
  if (handle == nullptr) return error;
  const cudaDataType_t type = DataType(p.dtype);
  const uint64_t element = p.dtype == 0 ? 4 : 2;
  LtDescriptors desc;
  TESSERA_LT_TRY(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is b, its B is a (the transposed product).
  const cublasOperation_t op_a = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  TESSERA_LT_TRY(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  TESSERA_LT_TRY(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    TESSERA_LT_TRY(
        cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue)));
    // The bias and the auxiliary output take D's type, f32 (their defaults).
    TESSERA_LT_TRY(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
    if (p.aux != nullptr) {
      const int64_t aux_ld = p.N;
      TESSERA_LT_TRY(
          cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux)));
      TESSERA_LT_TRY(
          cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }
  }
  const auto rows = [](int64_t n) { return static_cast<uint64_t>(n); };
  // Stored (before op): b is N x K (ld N), or K x N (ld K) when tb; a is
  // K x M (ld K), or M x K (ld M) when ta; d is N x M (ld N).
  TESSERA_LT_TRY(p.tb ? cublasLtMatrixLayoutCreate(&desc.a, type, rows(p.K), rows(p.N), p.K)
                      : cublasLtMatrixLayoutCreate(&desc.a, type, rows(p.N), rows(p.K), p.N));
  TESSERA_LT_TRY(p.ta ? cublasLtMatrixLayoutCreate(&desc.b, type, rows(p.M), rows(p.K), p.M)
                      : cublasLtMatrixLayoutCreate(&desc.b, type, rows(p.K), rows(p.M), p.K));
  TESSERA_LT_TRY(cublasLtMatrixLayoutCreate(&desc.d, CUDA_R_32F, rows(p.N), rows(p.M), p.N));
  const int64_t stride_a = p.K * p.N, stride_b = p.M * p.K, stride_d = p.M * p.N;
  if (p.batch > 1) {
    const auto count = static_cast<int32_t>(p.batch);
    for (const auto& [layout, stride] :
         {std::pair{desc.a, stride_a}, std::pair{desc.b, stride_b}, std::pair{desc.d, stride_d}}) {
      TESSERA_LT_TRY(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      TESSERA_LT_TRY(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof(stride)));
    }
  }
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
  const bool batched = p.batch > 1;
  const float* c = p.c != nullptr ? p.c : p.d;
  const uint32_t alignments[4] = {
      AlignmentOf(p.b, batched ? stride_a * element : 0), AlignmentOf(p.a, batched ? stride_b * element : 0),
      AlignmentOf(c, batched ? stride_d * 4 : 0), AlignmentOf(p.d, batched ? stride_d * 4 : 0)};
  // The heuristic's answer for everything it is asked about, so each act
  // of a job asks once per shape, not once per call (a training step
  // repeats the same few hundred products).
  const LtKey key = {reinterpret_cast<int64_t>(handle),
                     p.dtype,
                     p.ta,
                     p.tb,
                     p.batch,
                     p.M,
                     p.N,
                     p.K,
                     static_cast<int64_t>(p.epilogue),
                     p.aux != nullptr,
                     p.c != nullptr,
                     alignments[0],
                     alignments[1],
                     alignments[2],
                     alignments[3],
                     static_cast<int64_t>(workspace_size)};
  thread_local std::map<LtKey, std::optional<cublasLtMatmulAlgo_t>> algorithms;
  auto known = algorithms.find(key);
  if (known == algorithms.end()) {
    TESSERA_LT_TRY(cublasLtMatmulPreferenceCreate(&desc.preference));
    TESSERA_LT_TRY(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                        &workspace_size, sizeof(workspace_size)));
    const cublasLtMatmulPreferenceAttributes_t attributes[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i) {
      TESSERA_LT_TRY(
          cublasLtMatmulPreferenceSetAttribute(desc.preference, attributes[i], &alignments[i], sizeof(alignments[i])));
    }
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d,
                                                                    desc.preference, 1, &result, &found);
    const bool none = heuristic == CUBLAS_STATUS_NOT_SUPPORTED || (heuristic == CUBLAS_STATUS_SUCCESS && found == 0);
    if (!none) TESSERA_LT_TRY(heuristic);
    if (algorithms.size() >= kMaxKnownProducts) algorithms.clear();
    known = algorithms.emplace(key, none ? std::nullopt : std::optional(result.algo)).first;
  }
  if (!known->second.has_value()) return 0;  // no algorithm: the caller composes it
  const float beta = p.c != nullptr ? 1.0f : 0.0f;
  TESSERA_LT_TRY(cublasLtMatmul(handle, desc.op, &p.alpha, p.b, desc.a, p.a, desc.b, &beta, c, desc.d, p.d, desc.d,
                                &*known->second, workspace, workspace_size, CurrentStream()));
  *ran = true;
  return 0;
}

}  // namespace

int CublasHandlesMade(int device) {
  if (device < 0 || device >= kMaxDevices) return 0;
  return BlasPool().made(device) + LtPool().made(device);
}

int PrepareLibraries(int device) {
  int previous = 0;
  if (const cudaError_t err = cudaGetDevice(&previous); err != cudaSuccess) return static_cast<int>(err);
  if (const cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return static_cast<int>(err);
  int error = 0;
  if (Handle(&error) != nullptr) LtHandle(&error);
  // (Checked here: left unchecked, its error would be the next launch's.)
  if (const cudaError_t err = cudaSetDevice(previous); err != cudaSuccess && error == 0) return static_cast<int>(err);
  return error;
}

int LaunchGemmBiasLt(int x_dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, const float* bias,
                     float* z, float* y, void* workspace, size_t workspace_bytes, bool* fused) {
  *fused = false;
  // GELU's auxiliary output needs a leading dimension divisible by 8.
  if (M == 0 || N == 0 || K == 0 || (y != nullptr && N % 8 != 0)) return 0;
  // With GELU: y = GELU(z) in the epilogue, z its auxiliary output.
  const bool gelu = y != nullptr;
  const LtProduct p{.dtype = x_dtype,
                    .M = M,
                    .N = N,
                    .K = K,
                    .a = x,
                    .b = w,
                    .d = gelu ? y : z,
                    .epilogue = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS,
                    .bias = bias,
                    .aux = gelu ? z : nullptr};
  if (const int err = RunLt(p, workspace, workspace_bytes, fused); err != 0 || !*fused) return err;
  return Finish();
}

int LaunchGemm(int a_dtype, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
               const void* a, const void* b, float* y, void* workspace, size_t workspace_bytes, const float* addend) {
  if (batch == 0 || M == 0 || N == 0) return 0;
  const size_t y_bytes = sizeof(float) * batch * M * N;
  if (K == 0) {  // an empty sum: zeros (plus the addend)
    const cudaError_t err = addend == nullptr ? cudaMemsetAsync(y, 0, y_bytes, CurrentStream())
                            : addend == y
                                ? cudaSuccess
                                : cudaMemcpyAsync(y, addend, y_bytes, cudaMemcpyDeviceToDevice, CurrentStream());
    return err != cudaSuccess ? static_cast<int>(err) : Finish();
  }
  // cuBLASLt first; cuBLAS where it has no algorithm for these types and
  // alignments.
  const LtProduct p{.dtype = a_dtype,
                    .ta = ta,
                    .tb = tb,
                    .batch = batch,
                    .M = M,
                    .N = N,
                    .K = K,
                    .alpha = alpha,
                    .a = a,
                    .b = b,
                    .d = y,
                    .c = addend};
  bool ran = false;
  if (const int err = RunLt(p, workspace, workspace_bytes, &ran); err != 0) return err;
  if (ran) return Finish();
  int error = 0;
  cublasHandle_t handle = Handle(&error);
  if (handle == nullptr) return error;
  // cuBLAS adds C in place: the addend copied into y first.
  if (addend != nullptr && addend != y) {
    if (const cudaError_t err = cudaMemcpyAsync(y, addend, y_bytes, cudaMemcpyDeviceToDevice, CurrentStream());
        err != cudaSuccess) {
      return static_cast<int>(err);
    }
  }
  const float beta = addend != nullptr ? 1.0f : 0.0f;
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
