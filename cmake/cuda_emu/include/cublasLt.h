#pragma once
// Tessera's CUDA emulator: the part of cuBLASLt that Tessera calls, run on
// the CPU (cmake/cuda_emu/cublas.cc). Enum values are the real header's.
// D = epilogue(alpha op(A) op(B) + beta C (+ bias)), matrices as their
// layouts describe them (column- or row-major, batched with strides).

#include <cstddef>
#include <cstdint>

#include "cublas_v2.h"

extern "C" {

typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque_st* cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque_st* cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque_st* cublasLtMatmulPreference_t;

// Serializable algorithm (as the real one): what the heuristic chose it for
// and the buffer alignments it assumes.
typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
  CUBLASLT_POINTER_MODE_HOST = CUBLAS_POINTER_MODE_HOST,
  CUBLASLT_POINTER_MODE_DEVICE = CUBLAS_POINTER_MODE_DEVICE,
} cublasLtPointerMode_t;

typedef enum {
  CUBLASLT_ORDER_COL = 0,
  CUBLASLT_ORDER_ROW = 1,
  CUBLASLT_ORDER_COL32 = 2,  // the tiled orders are not emulated (CUBLAS_STATUS_NOT_SUPPORTED)
  CUBLASLT_ORDER_COL4_4R2_8C = 3,
  CUBLASLT_ORDER_COL32_2R_4R4 = 4,
} cublasLtOrder_t;

typedef enum {
  CUBLASLT_MATRIX_LAYOUT_TYPE = 0,                  // uint32_t
  CUBLASLT_MATRIX_LAYOUT_ORDER = 1,                 // int32_t, default CUBLASLT_ORDER_COL
  CUBLASLT_MATRIX_LAYOUT_ROWS = 2,                  // uint64_t
  CUBLASLT_MATRIX_LAYOUT_COLS = 3,                  // uint64_t
  CUBLASLT_MATRIX_LAYOUT_LD = 4,                    // int64_t
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,           // int32_t, default 1
  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,  // int64_t (elements), default 0
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,                // int32_t
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,                  // int32_t
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,                // int32_t, default host
  CUBLASLT_MATMUL_DESC_TRANSA = 3,                      // int32_t, default CUBLAS_OP_N
  CUBLASLT_MATMUL_DESC_TRANSB = 4,                      // int32_t, default CUBLAS_OP_N
  CUBLASLT_MATMUL_DESC_TRANSC = 5,                      // int32_t, CUBLAS_OP_N only
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,                    // uint32_t, default CUBLASLT_EPILOGUE_DEFAULT
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,                // const void*: D's rows, added to every column
  CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10,          // int64_t (elements), default 0
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,       // void*: the GELU input, column-major
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,            // int64_t: >= D's rows, divisible by 8
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE = 13,  // int64_t, divisible by 8
  CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = 15,            // int32_t, a hint (ignored)
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22,     // int32_t, default -1: D's type
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,             // int32_t, default -1: D's type
} cublasLtMatmulDescAttributes_t;

typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_RELU_AUX = 130,  // the ReLU bit masks and gradients are not emulated
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_RELU_BIAS = 6,
  CUBLASLT_EPILOGUE_RELU_AUX_BIAS = 134,
  CUBLASLT_EPILOGUE_DRELU = 136,
  CUBLASLT_EPILOGUE_DRELU_BGRAD = 152,
  CUBLASLT_EPILOGUE_GELU = 32,  // GELU's tanh form
  CUBLASLT_EPILOGUE_GELU_AUX = 160,
  CUBLASLT_EPILOGUE_GELU_BIAS = 36,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
  CUBLASLT_EPILOGUE_DGELU = 192,
  CUBLASLT_EPILOGUE_DGELU_BGRAD = 208,
  CUBLASLT_EPILOGUE_BGRADA = 256,
  CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

typedef enum {
  CUBLASLT_SEARCH_BEST_FIT = 0,
  CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID = 1,
} cublasLtMatmulSearch_t;

typedef enum {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,            // uint32_t, CUBLASLT_SEARCH_BEST_FIT only
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    // uint64_t, default 0
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,  // uint32_t (the emulator never splits k)
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  // uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
  CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT = 9,  // float (ignored)
  CUBLASLT_MATMUL_PREF_IMPL_MASK = 12,       // uint64_t (ignored)
} cublasLtMatmulPreferenceAttributes_t;

// Handles belong to the device current at creation, as cuBLAS's.
cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
const char* cublasLtGetStatusName(cublasStatus_t status);
const char* cublasLtGetStatusString(cublasStatus_t status);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t sizeInBytes, size_t* sizeWritten);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              void* buf, size_t sizeInBytes, size_t* sizeWritten);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes);
cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                    size_t sizeInBytes, size_t* sizeWritten);

// At most one algorithm. None (CUBLAS_STATUS_NOT_SUPPORTED, *returnAlgoCount
// 0) for what cuBLASLt has no kernel for: an empty extent, an unemulated
// type / epilogue / order, a declared alignment below the element size, an
// auxiliary leading dimension or batch stride not divisible by 8.
// CUBLAS_STATUS_INVALID_VALUE for inconsistent layouts.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount);

// Checks as the heuristic does, then the pointers against the alignments the
// algorithm was chosen for (CUBLAS_STATUS_INVALID_VALUE), then queues the
// product on `stream`. algo may be null (an implicit heuristic on the
// pointers' own alignments).
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream);

}  // extern "C"
