// Tessera's CUDA emulator: cuBLAS's and cuBLASLt's GEMMs on the CPU, with
// real cuBLAS's semantics (column-major operands, leading dimensions, batch
// strides, transposes, C unread when beta is 0, the epilogues' bias and
// auxiliary layouts), so that a wrong mapping in the caller shows up as a
// wrong result. A call checks its arguments at once and queues the product
// on its stream (cuda_emu::Enqueue); the matrices are read when it runs.
// Products accumulate in double and are rounded once to the output type.

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cuda_emu/float16.h"
#include "cuda_emu/internal.h"

struct cublasContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

struct cublasLtContext {
  int device = 0;
};

// Attribute fields have the C types the attributes are set with.
struct cublasLtMatmulDescOpaque_st {
  int32_t compute_type = CUBLAS_COMPUTE_32F;
  int32_t scale_type = CUDA_R_32F;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N;
  int32_t transb = CUBLAS_OP_N;
  int32_t transc = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int64_t bias_batch_stride = 0;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int64_t aux_batch_stride = 0;
  int32_t sm_count_target = 0;
  int32_t aux_type = -1;  // -1: D's type
  int32_t bias_type = -1;
};

struct cublasLtMatrixLayoutOpaque_st {
  uint32_t type = CUDA_R_32F;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0;
  uint64_t cols = 0;
  int64_t ld = 0;
  int32_t batch_count = 1;
  int64_t batch_stride = 0;
};

struct cublasLtMatmulPreferenceOpaque_st {
  uint32_t search_mode = CUBLASLT_SEARCH_BEST_FIT;
  uint64_t max_workspace = 0;
  uint32_t reduction_mask = 7;
  uint32_t alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's default assumption
  float max_waves = 0.0f;
  uint64_t impl_mask = ~uint64_t{0};
};

namespace cuda_emu {
namespace {

// ---- Element types ----

// HalfToFloat, FloatToHalf, Bf16ToFloat, FloatToBf16: cuda_emu/float16.h.

// Bytes of an element of a type the emulator reads or writes; 0 otherwise.
size_t ElementSize(int type) {
  switch (type) {
    case CUDA_R_8I:
      return 1;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    case CUDA_R_32F:
      return 4;
    case CUDA_R_64F:
      return 8;
    default:
      return 0;
  }
}

template <class T>
T Raw(const void* base, int64_t index) {
  T value;
  std::memcpy(&value, static_cast<const char*>(base) + index * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return value;
}

double Load(const void* base, int64_t index, cudaDataType_t type) {
  switch (type) {
    case CUDA_R_8I:
      return Raw<int8_t>(base, index);
    case CUDA_R_16F:
      return HalfToFloat(Raw<uint16_t>(base, index));
    case CUDA_R_16BF:
      return Bf16ToFloat(Raw<uint16_t>(base, index));
    case CUDA_R_32F:
      return Raw<float>(base, index);
    case CUDA_R_64F:
      return Raw<double>(base, index);
    default:
      return NAN;  // refused before any work is queued
  }
}

template <class T>
void PutRaw(void* base, int64_t index, T value) {
  std::memcpy(static_cast<char*>(base) + index * static_cast<int64_t>(sizeof(T)), &value, sizeof(T));
}

// Half and bf16 outputs go through float, as the GPU's f32 epilogue does.
void Store(void* base, int64_t index, cudaDataType_t type, double value) {
  switch (type) {
    case CUDA_R_16F:
      PutRaw(base, index, FloatToHalf(static_cast<float>(value)));
      break;
    case CUDA_R_16BF:
      PutRaw(base, index, FloatToBf16(static_cast<float>(value)));
      break;
    case CUDA_R_32F:
      PutRaw(base, index, static_cast<float>(value));
      break;
    case CUDA_R_64F:
      PutRaw(base, index, value);
      break;
    default:
      break;  // refused before any work is queued
  }
}

// ---- The product ----

// One matrix of a batched product: op(X)(r, c) of batch b.
struct Operand {
  const void* data = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  int64_t ld = 0;
  int64_t stride = 0;  // elements between batches
  bool row_major = false;
  bool transposed = false;

  int64_t Index(int64_t b, int64_t r, int64_t c) const {
    if (transposed) std::swap(r, c);
    return b * stride + (row_major ? r * ld + c : r + c * ld);
  }
};

// D = epilogue(alpha op(A) op(B) + beta C + bias), all it needs by value:
// the task outlives the call's descriptors.
struct Gemm {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  Operand a, b, c, d;
  bool f64 = false;                 // CUBLAS_COMPUTE_64F: f64 operands and scalars
  bool device_scalars = false;      // read alpha / beta when the task runs
  const void* alpha_ptr = nullptr;  // with device_scalars
  const void* beta_ptr = nullptr;
  double alpha = 0.0, beta = 0.0;
  bool bias = false, aux = false, relu = false, gelu = false;
  const void* bias_data = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  int64_t bias_stride = 0;
  void* aux_data = nullptr;
  cudaDataType_t aux_type = CUDA_R_32F;
  int64_t aux_ld = 0, aux_stride = 0;
};

// GELU's tanh form, as cuBLASLt's epilogue.
double Gelu(double x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

void Epilogue(const Gemm& g, int64_t batch, int64_t i, int64_t j, double product) {
  double v = g.alpha * product;
  if (g.beta != 0.0) v += g.beta * Load(g.c.data, g.c.Index(batch, i, j), g.c.type);
  if (g.bias) v += Load(g.bias_data, batch * g.bias_stride + i, g.bias_type);
  if (g.aux) Store(g.aux_data, batch * g.aux_stride + i + j * g.aux_ld, g.aux_type, v);
  if (g.relu && v < 0.0) v = 0.0;  // NaN stays NaN
  if (g.gelu) v = Gelu(v);
  Store(const_cast<void*>(g.d.data), g.d.Index(batch, i, j), g.d.type, v);  // D came in writable
}

constexpr int64_t kBlockRows = 64, kBlockCols = 4;

// acc[c][i] += a[i] * b[c] for a block's 4 columns. A full block's constant
// trip count (kRows) lets -O2's cheap vectorizer take the loop.
template <int64_t kRows, class T>
void Update4(const T* a, int64_t rows, const double (&b)[kBlockCols], double (&acc)[kBlockCols][kBlockRows]) {
  const int64_t count = kRows > 0 ? kRows : rows;
  for (int64_t i = 0; i < count; ++i) {
    const double x = a[i];
    acc[0][i] += x * b[0];
    acc[1][i] += x * b[1];
    acc[2][i] += x * b[2];
    acc[3][i] += x * b[3];
  }
}

// Columns [j_begin, j_end) of one batch; a: op(A) column-major (m x k),
// b: op(B) column-major (k x n), both decoded (null without products).
// Blocks of 64 rows by 4 columns keep the accumulators in L1 and use each
// loaded A element 4 times; T-to-double products are exact for f32 and below.
template <class T>
void Columns(const Gemm& g, int64_t batch, const T* a, const T* b, int64_t j_begin, int64_t j_end) {
  double acc[kBlockCols][kBlockRows];
  for (int64_t j = j_begin; j < j_end; j += kBlockCols) {
    const int64_t nj = std::min(kBlockCols, j_end - j);
    for (int64_t i0 = 0; i0 < g.m; i0 += kBlockRows) {
      const int64_t ni = std::min(kBlockRows, g.m - i0);
      for (auto& column : acc) std::fill(column, column + kBlockRows, 0.0);
      for (int64_t p = 0; a != nullptr && p < g.k; ++p) {
        double bp[kBlockCols] = {};  // columns past nj multiply zeros into unused accumulators
        for (int64_t jj = 0; jj < nj; ++jj) bp[jj] = b[(j + jj) * g.k + p];
        const T* ap = a + p * g.m + i0;
        if (ni == kBlockRows) {
          Update4<kBlockRows>(ap, ni, bp, acc);
        } else {
          Update4<0>(ap, ni, bp, acc);
        }
      }
      for (int64_t jj = 0; jj < nj; ++jj) {
        for (int64_t ii = 0; ii < ni; ++ii) Epilogue(g, batch, i0 + ii, j + jj, acc[jj][ii]);
      }
    }
  }
}

// Splits a large product's columns over a few threads (each column is
// computed alone, so the result does not depend on the split).
template <class F>
void ParallelColumns(int64_t n, int64_t work, const F& f) {
  int64_t threads = 1;
  if (work >= (int64_t{1} << 22)) {
    threads = std::min<int64_t>({std::max(1u, std::thread::hardware_concurrency()), 8, (n + 3) / 4});
  }
  const int64_t chunk = ((n + threads - 1) / threads + 3) / 4 * 4;
  std::vector<std::thread> workers;
  int64_t begin = 0;
  for (; begin + chunk < n; begin += chunk) {
    try {
      workers.emplace_back(f, begin, begin + chunk);
    } catch (const std::system_error&) {
      break;  // no thread: this one does the rest
    }
  }
  f(begin, n);
  for (auto& worker : workers) worker.join();
}

template <class T>
void RunTyped(const Gemm& g) {
  const bool products = g.alpha != 0.0 && g.k > 0;  // else A and B are not read, as BLAS
  std::vector<T> a(products ? g.m * g.k : 0), b(products ? g.k * g.n : 0);
  for (int64_t batch = 0; batch < g.batch; ++batch) {
    if (products) {
      for (int64_t p = 0; p < g.k; ++p) {
        for (int64_t i = 0; i < g.m; ++i) {
          a[p * g.m + i] = static_cast<T>(Load(g.a.data, g.a.Index(batch, i, p), g.a.type));
        }
      }
      for (int64_t j = 0; j < g.n; ++j) {
        for (int64_t p = 0; p < g.k; ++p) {
          b[j * g.k + p] = static_cast<T>(Load(g.b.data, g.b.Index(batch, p, j), g.b.type));
        }
      }
    }
    ParallelColumns(g.n, g.m * g.n * g.k, [&](int64_t begin, int64_t end) {
      Columns<T>(g, batch, products ? a.data() : nullptr, products ? b.data() : nullptr, begin, end);
    });
  }
}

// The queued task. A null pointer that would be read or written is the GPU's
// illegal address, the stream's sticky error.
cudaError_t Run(Gemm g) {
  if (g.device_scalars) {
    if (g.alpha_ptr == nullptr || g.beta_ptr == nullptr) return cudaErrorIllegalAddress;
    const cudaDataType_t scale = g.f64 ? CUDA_R_64F : CUDA_R_32F;
    g.alpha = Load(g.alpha_ptr, 0, scale);
    g.beta = Load(g.beta_ptr, 0, scale);
  }
  const bool products = g.alpha != 0.0 && g.k > 0;
  if (g.d.data == nullptr || (products && (g.a.data == nullptr || g.b.data == nullptr)) ||
      (g.beta != 0.0 && g.c.data == nullptr) || (g.bias && g.bias_data == nullptr) ||
      (g.aux && g.aux_data == nullptr)) {
    return cudaErrorIllegalAddress;
  }
  if (g.f64) {
    RunTyped<double>(g);
  } else {
    RunTyped<float>(g);
  }
  return cudaSuccess;
}

// The GEMM's function for lazy loading: cuBLAS picks its kernels by the
// types, the epilogue and the shape, so each new combination counts as a
// new function (the worst case).
std::string GemmFunction(const Gemm& g) {
  std::string name = "gemm";
  for (const Operand* o : {&g.a, &g.b, &g.c, &g.d}) {
    name += ":" + std::to_string(static_cast<int>(o->type)) + (o->transposed ? "t" : "n") + (o->row_major ? "r" : "c");
  }
  for (const int64_t v : {g.m, g.n, g.k, g.batch}) name += ":" + std::to_string(v);
  name += std::string(":") + (g.f64 ? "d" : "") + (g.bias ? "b" : "") + (g.aux ? "a" : "") + (g.relu ? "r" : "") +
          (g.gelu ? "g" : "");
  return name;
}

// Queues the product on `stream` for a handle of `device`. A thread whose
// current device is not the handle's, or a stream of another device, is
// refused with CUBLAS_STATUS_EXECUTION_FAILED: real cuBLAS would launch on
// the wrong device or fail the launch, and a Tessera thread that does this
// has lost track of its device.
cublasStatus_t Launch(int device, cudaStream_t stream, const Gemm& g) {
  if (CurrentDevice() != device || StreamDevice(stream) != device) return CUBLAS_STATUS_EXECUTION_FAILED;
  LoadFunction(device, GemmFunction(g));
  if (Enqueue(stream, [g] { return Run(g); }) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLAS ----

bool ValidOp(int op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

bool ValidAlgo(int algo) {
  return (algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
         (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
}

// The compute type's family: 32 (f32 accumulation), 64, or 0 (not emulated).
// CUBLAS_COMPUTE_32F_FAST_TF32 computes as CUBLAS_COMPUTE_32F here.
int ComputeFamily(int compute) {
  switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      return 32;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
      return 64;
    default:
      return 0;
  }
}

// cublasGemmEx's type combinations that the emulator has (cuBLAS's table).
bool GemmExTypes(int family, int a, int b, int c) {
  if (a != b) return false;
  if (family == 64) return a == CUDA_R_64F && c == CUDA_R_64F;
  if (family != 32) return false;
  switch (a) {
    case CUDA_R_32F:
    case CUDA_R_8I:
      return c == CUDA_R_32F;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return c == CUDA_R_32F || c == a;
    default:
      return false;
  }
}

cublasStatus_t GemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                  int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                                  long long strideA, const void* B, cudaDataType Btype, int ldb, long long strideB,
                                  const void* beta, void* C, cudaDataType Ctype, int ldc, long long strideC, int batch,
                                  cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!ValidOp(transa) || !ValidOp(transb) || m < 0 || n < 0 || k < 0 || batch < 0 || !ValidAlgo(algo)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const int family = ComputeFamily(compute);
  if (!GemmExTypes(family, Atype, Btype, Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;  // nothing to do, as cuBLAS

  Gemm g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.a = {A, Atype, lda, strideA, false, ta};
  g.b = {B, Btype, ldb, strideB, false, tb};
  g.c = {C, Ctype, ldc, strideC, false, false};
  g.d = g.c;
  g.f64 = family == 64;
  const cudaDataType_t scale = g.f64 ? CUDA_R_64F : CUDA_R_32F;
  if (handle->pointer_mode == CUBLAS_POINTER_MODE_DEVICE) {
    g.device_scalars = true;
    g.alpha_ptr = alpha;
    g.beta_ptr = beta;
  } else {  // host scalars are read now: the caller's may be gone when the task runs
    g.alpha = Load(alpha, 0, scale);
    g.beta = Load(beta, 0, scale);
  }
  return Launch(handle->device, handle->stream, g);
}

// ---- cuBLASLt ----

bool SupportedEpilogue(uint32_t epilogue) {
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return true;
    default:
      return false;
  }
}

// An epilogue vector's or matrix's type: D's unless set; f32 or D's type.
bool EpilogueType(int32_t set, int d_type, cudaDataType_t* type) {
  const int resolved = set == -1 ? d_type : set;
  if (resolved != d_type && resolved != CUDA_R_32F) return false;
  *type = static_cast<cudaDataType_t>(resolved);
  return true;
}

bool LayoutOrder(int32_t order) { return order == CUBLASLT_ORDER_COL || order == CUBLASLT_ORDER_ROW; }

bool FitsLd(const cublasLtMatrixLayoutOpaque_st& layout) {
  const auto extent = static_cast<int64_t>(layout.order == CUBLASLT_ORDER_ROW ? layout.cols : layout.rows);
  return layout.ld >= std::max<int64_t>(1, extent);
}

Operand LtOperand(const cublasLtMatrixLayoutOpaque_st& layout, bool transposed) {
  Operand op;
  op.type = static_cast<cudaDataType_t>(layout.type);
  op.ld = layout.ld;
  op.stride = layout.batch_stride;
  op.row_major = layout.order == CUBLASLT_ORDER_ROW;
  op.transposed = transposed;
  return op;
}

// What the heuristic and cublasLtMatmul both check of the descriptors, and
// the product they describe (pointers and scalars unset). NOT_SUPPORTED: no
// kernel for it; INVALID_VALUE: descriptors that contradict each other.
// Extents come from D (m x n) and op(A) (k); every layout must agree.
cublasStatus_t Describe(const cublasLtMatmulDescOpaque_st* op, const cublasLtMatrixLayoutOpaque_st* a,
                        const cublasLtMatrixLayoutOpaque_st* b, const cublasLtMatrixLayoutOpaque_st* c,
                        const cublasLtMatrixLayoutOpaque_st* d, Gemm* g) {
  if (op == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!ValidOp(op->transa) || !ValidOp(op->transb) || !ValidOp(op->transc)) return CUBLAS_STATUS_INVALID_VALUE;
  const int family = ComputeFamily(op->compute_type);
  if (family == 0 || op->scale_type != (family == 64 ? CUDA_R_64F : CUDA_R_32F)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (op->transc != CUBLAS_OP_N || !SupportedEpilogue(op->epilogue)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (op->pointer_mode != CUBLASLT_POINTER_MODE_HOST && op->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (a->type != b->type || c->type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (family == 64 ? (a->type != CUDA_R_64F || d->type != CUDA_R_64F)
                   : ((a->type != CUDA_R_32F && a->type != CUDA_R_16F && a->type != CUDA_R_16BF) ||
                      (d->type != CUDA_R_32F && d->type != a->type))) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!LayoutOrder(a->order) || !LayoutOrder(b->order) || !LayoutOrder(c->order) || !LayoutOrder(d->order)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool ta = op->transa != CUBLAS_OP_N, tb = op->transb != CUBLAS_OP_N;
  const uint64_t m = d->rows, n = d->cols, k = ta ? a->rows : a->cols;
  if ((ta ? a->cols : a->rows) != m || (tb ? b->cols : b->rows) != k || (tb ? b->rows : b->cols) != n || c->rows != m ||
      c->cols != n) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // Out of place, C and D may differ only in leading dimension and stride.
  if (c->order != d->order || c->batch_count != d->batch_count) return CUBLAS_STATUS_INVALID_VALUE;
  if (!FitsLd(*a) || !FitsLd(*b) || !FitsLd(*c) || !FitsLd(*d)) return CUBLAS_STATUS_INVALID_VALUE;
  if (d->batch_count < 1 || a->batch_count != d->batch_count || b->batch_count != d->batch_count) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  constexpr uint64_t kMaxExtent = 0x7fffffff;  // cuBLASLt's extents are int32
  if (m > kMaxExtent || n > kMaxExtent || k > kMaxExtent) return CUBLAS_STATUS_NOT_SUPPORTED;
  // No kernel takes an empty extent (Tessera composes those itself).
  if (m == 0 || n == 0 || k == 0) return CUBLAS_STATUS_NOT_SUPPORTED;

  const uint32_t e = op->epilogue;
  g->bias = (e & CUBLASLT_EPILOGUE_BIAS) != 0;
  g->relu = (e & CUBLASLT_EPILOGUE_RELU) != 0;
  g->gelu = (e & CUBLASLT_EPILOGUE_GELU) != 0;
  g->aux = (e & 128u) != 0;
  if (g->bias && !EpilogueType(op->bias_type, d->type, &g->bias_type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (g->aux) {
    if (!EpilogueType(op->aux_type, d->type, &g->aux_type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (op->aux_ld < static_cast<int64_t>(m)) return CUBLAS_STATUS_INVALID_VALUE;
    // cuBLASLt's GELU input matrix: leading dimension and batch stride divisible by 8.
    if (op->aux_ld % 8 != 0 || (d->batch_count > 1 && op->aux_batch_stride % 8 != 0)) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  g->m = static_cast<int64_t>(m);
  g->n = static_cast<int64_t>(n);
  g->k = static_cast<int64_t>(k);
  g->batch = d->batch_count;
  g->a = LtOperand(*a, ta);
  g->b = LtOperand(*b, tb);
  g->c = LtOperand(*c, false);
  g->d = LtOperand(*d, false);
  g->f64 = family == 64;
  g->device_scalars = op->pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
  g->bias_data = op->bias;
  g->bias_stride = op->bias_batch_stride;
  g->aux_data = op->aux;
  g->aux_ld = op->aux_ld;
  g->aux_stride = op->aux_batch_stride;
  return CUBLAS_STATUS_SUCCESS;
}

// An algorithm: a tag, what it was chosen for, and the alignments of A, B,
// C and D it assumes (the preferences' declared ones).
constexpr uint64_t kAlgoTag = 0x54657373436d4c74ull;

void AlgoKey(const cublasLtMatmulDescOpaque_st& op, const Gemm& g, uint64_t key[2]) {
  key[0] = uint64_t{op.epilogue} | static_cast<uint64_t>(op.transa) << 16 | static_cast<uint64_t>(op.transb) << 20 |
           static_cast<uint64_t>(op.compute_type) << 32;
  key[1] = static_cast<uint64_t>(g.a.type) | static_cast<uint64_t>(g.b.type) << 8 |
           static_cast<uint64_t>(g.d.type) << 16 | static_cast<uint64_t>(g.bias ? g.bias_type : 255) << 24 |
           static_cast<uint64_t>(g.aux ? g.aux_type : 255) << 32;
}

bool Aligned(const void* p, uint64_t alignment) {
  return alignment != 0 && reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

template <class T>
cublasStatus_t SetField(T* field, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

template <class T>
cublasStatus_t GetField(const T& field, void* buf, size_t size, size_t* written) {
  if (size == 0) {
    if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *written = sizeof(T);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, &field, sizeof(T));
  if (written != nullptr) *written = sizeof(T);
  return CUBLAS_STATUS_SUCCESS;
}

// Calls `f` on the field an attribute names (a pointer of its own type), or
// returns CUBLAS_STATUS_INVALID_VALUE for an attribute the emulator lacks.
template <class Desc, class F>
cublasStatus_t WithDescField(Desc* d, cublasLtMatmulDescAttributes_t attr, const F& f) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return f(&d->compute_type);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return f(&d->scale_type);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return f(&d->pointer_mode);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return f(&d->transa);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return f(&d->transb);
    case CUBLASLT_MATMUL_DESC_TRANSC:
      return f(&d->transc);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return f(&d->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return f(&d->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
      return f(&d->bias_batch_stride);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return f(&d->aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return f(&d->aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
      return f(&d->aux_batch_stride);
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET:
      return f(&d->sm_count_target);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return f(&d->aux_type);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return f(&d->bias_type);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

template <class Layout, class F>
cublasStatus_t WithLayoutField(Layout* l, cublasLtMatrixLayoutAttribute_t attr, const F& f) {
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      return f(&l->type);
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return f(&l->order);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return f(&l->rows);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return f(&l->cols);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return f(&l->ld);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return f(&l->batch_count);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return f(&l->batch_stride);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

template <class Pref, class F>
cublasStatus_t WithPreferenceField(Pref* p, cublasLtMatmulPreferenceAttributes_t attr, const F& f) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      return f(&p->search_mode);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return f(&p->max_workspace);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return f(&p->reduction_mask);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return f(&p->alignment[0]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return f(&p->alignment[1]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return f(&p->alignment[2]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return f(&p->alignment[3]);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
      return f(&p->max_waves);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
      return f(&p->impl_mask);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

const char* StatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* StatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "an error was detected when checking the current licensing";
  }
  return "unknown error";
}

}  // namespace
}  // namespace cuda_emu

using cuda_emu::Describe;
using cuda_emu::Gemm;

namespace {

// The library's start on a device: under eager loading its modules load
// then, every kernel of them, which may wait for the device (lazily, each
// GEMM's kernels load at their first use instead: Launch).
void StartOnDevice() {
  if (!cuda_emu::LazyLoading()) cuda_emu::LoadModule(cuda_emu::CurrentDevice(), "cublas");
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  StartOnDevice();
  *handle = new (std::nothrow) cublasContext;
  if (*handle == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  (*handle)->device = cuda_emu::CurrentDevice();
  return CUBLAS_STATUS_SUCCESS;
}

// Queued products hold no reference to the handle: nothing to wait for.
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion(cublasHandle_t handle, int* version) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *version = 120000;  // the cuBLAS 12 API
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base < CUBLAS_DEFAULT_MATH || base > CUBLAS_TF32_TENSOR_OP_MATH) return CUBLAS_STATUS_INVALID_VALUE;
  handle->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t* mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) { return cuda_emu::StatusName(status); }
const char* cublasGetStatusString(cublasStatus_t status) { return cuda_emu::StatusString(status); }

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return cuda_emu::GemmStridedBatched(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta,
                                      C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
  return cuda_emu::GemmStridedBatched(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                                      strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
  return cuda_emu::GemmStridedBatched(handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb,
                                      0, beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb, long long int strideB,
                                         const float* beta, float* C, int ldc, long long int strideC, int batchCount) {
  return cuda_emu::GemmStridedBatched(handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, strideA, B,
                                      CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batchCount,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  StartOnDevice();
  *lightHandle = new (std::nothrow) cublasLtContext;
  if (*lightHandle == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  (*lightHandle)->device = cuda_emu::CurrentDevice();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) { return cuda_emu::StatusName(status); }
const char* cublasLtGetStatusString(cublasStatus_t status) { return cuda_emu::StatusString(status); }

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *matLayout = new (std::nothrow) cublasLtMatrixLayoutOpaque_st;
  if (*matLayout == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  (*matLayout)->type = static_cast<uint32_t>(type);
  (*matLayout)->rows = rows;
  (*matLayout)->cols = cols;
  (*matLayout)->ld = ld;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return cuda_emu::WithLayoutField(matLayout, attr,
                                   [&](auto* field) { return cuda_emu::SetField(field, buf, sizeInBytes); });
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t sizeInBytes, size_t* sizeWritten) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return cuda_emu::WithLayoutField(
      matLayout, attr, [&](auto* field) { return cuda_emu::GetField(*field, buf, sizeInBytes, sizeWritten); });
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *matmulDesc = new (std::nothrow) cublasLtMatmulDescOpaque_st;
  if (*matmulDesc == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  (*matmulDesc)->compute_type = computeType;
  (*matmulDesc)->scale_type = scaleType;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return cuda_emu::WithDescField(matmulDesc, attr,
                                 [&](auto* field) { return cuda_emu::SetField(field, buf, sizeInBytes); });
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              void* buf, size_t sizeInBytes, size_t* sizeWritten) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return cuda_emu::WithDescField(
      matmulDesc, attr, [&](auto* field) { return cuda_emu::GetField(*field, buf, sizeInBytes, sizeWritten); });
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new (std::nothrow) cublasLtMatmulPreferenceOpaque_st;
  return *pref == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return cuda_emu::WithPreferenceField(pref, attr,
                                       [&](auto* field) { return cuda_emu::SetField(field, buf, sizeInBytes); });
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                    size_t sizeInBytes, size_t* sizeWritten) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return cuda_emu::WithPreferenceField(
      pref, attr, [&](auto* field) { return cuda_emu::GetField(*field, buf, sizeInBytes, sizeWritten); });
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requestedAlgoCount <= 0 || heuristicResultsArray == nullptr || returnAlgoCount == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returnAlgoCount = 0;
  Gemm g;
  if (const cublasStatus_t st = Describe(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &g); st != CUBLAS_STATUS_SUCCESS) {
    return st;
  }
  const cublasLtMatmulPreferenceOpaque_st defaults;
  const cublasLtMatmulPreferenceOpaque_st& pref = preference != nullptr ? *preference : defaults;
  if (pref.search_mode != CUBLASLT_SEARCH_BEST_FIT) return CUBLAS_STATUS_NOT_SUPPORTED;
  // No kernel reads a buffer aligned below its element size; the epilogue's
  // pointers are judged by their values, as cuBLASLt does.
  const cudaDataType_t types[4] = {g.a.type, g.b.type, g.c.type, g.d.type};
  for (int i = 0; i < 4; ++i) {
    if (pref.alignment[i] < cuda_emu::ElementSize(types[i])) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if ((g.bias && !cuda_emu::Aligned(g.bias_data, cuda_emu::ElementSize(g.bias_type))) ||
      (g.aux && !cuda_emu::Aligned(g.aux_data, cuda_emu::ElementSize(g.aux_type)))) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  cublasLtMatmulHeuristicResult_t& result = heuristicResultsArray[0];
  result = {};
  result.algo.data[0] = cuda_emu::kAlgoTag;
  cuda_emu::AlgoKey(*operationDesc, g, &result.algo.data[1]);
  for (int i = 0; i < 4; ++i) result.algo.data[3 + i] = pref.alignment[i];
  result.workspaceSize = 0;
  result.state = CUBLAS_STATUS_SUCCESS;
  result.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
  (void)workspace;  // the emulated algorithms need none
  (void)workspaceSizeInBytes;
  if (lightHandle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Gemm g;
  if (const cublasStatus_t st = Describe(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &g); st != CUBLAS_STATUS_SUCCESS) {
    return st;
  }
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // In place, C's layout must be D's.
  if (C == D && (Cdesc->ld != Ddesc->ld || Cdesc->batch_stride != Ddesc->batch_stride)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // The alignments the algorithm assumes: the declared ones, or without an
  // algorithm (an implicit heuristic on these pointers) the element sizes.
  uint64_t alignment[4] = {cuda_emu::ElementSize(g.a.type), cuda_emu::ElementSize(g.b.type),
                           cuda_emu::ElementSize(g.c.type), cuda_emu::ElementSize(g.d.type)};
  if (algo != nullptr) {
    uint64_t key[2];
    cuda_emu::AlgoKey(*computeDesc, g, key);
    if (algo->data[0] != cuda_emu::kAlgoTag || algo->data[1] != key[0] || algo->data[2] != key[1]) {
      return CUBLAS_STATUS_INVALID_VALUE;  // not an algorithm for this operation
    }
    for (int i = 0; i < 4; ++i) alignment[i] = std::max(alignment[i], algo->data[3 + i]);
  }
  // A buffer less aligned than the algorithm assumes: refused rather than
  // the misaligned-address fault a kernel would raise.
  if ((A != nullptr && !cuda_emu::Aligned(A, alignment[0])) || (B != nullptr && !cuda_emu::Aligned(B, alignment[1])) ||
      (C != nullptr && !cuda_emu::Aligned(C, alignment[2])) || (D != nullptr && !cuda_emu::Aligned(D, alignment[3]))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if ((g.bias && (g.bias_data == nullptr || !cuda_emu::Aligned(g.bias_data, cuda_emu::ElementSize(g.bias_type)))) ||
      (g.aux && (g.aux_data == nullptr || !cuda_emu::Aligned(g.aux_data, cuda_emu::ElementSize(g.aux_type))))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  g.a.data = A;
  g.b.data = B;
  g.c.data = C;
  g.d.data = D;
  if (g.device_scalars) {
    g.alpha_ptr = alpha;
    g.beta_ptr = beta;
  } else {
    const cudaDataType_t scale = g.f64 ? CUDA_R_64F : CUDA_R_32F;
    g.alpha = cuda_emu::Load(alpha, 0, scale);
    g.beta = cuda_emu::Load(beta, 0, scale);
  }
  return cuda_emu::Launch(lightHandle->device, stream, g);
}

}  // extern "C"
