#pragma once
// CPU kernels of the matmul family (ops/matmul.cc), and the GEMM driver they
// share, for other kernels that need a GEMM: row-major f32 through oneDNN's
// single-threaded dnnl_sgemm (bf16 through its matmul primitive), cut into
// pieces for the intra-op pool.

#include <cstdint>

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cpu {

// y = alpha * op(a) @ op(b) on 2-D local tensors (attrs transpose_a,
// transpose_b, alpha).
absl::Status MatmulKernel(KernelContext& ctx);
// The same for every item of equal leading (batch) dimensions.
absl::Status BatchMatmulKernel(KernelContext& ctx);
// y = alpha * op(a) @ op(b) + c (matmul_add): one RunGemm with the addend
// epilogue.
absl::Status MatmulAddKernel(KernelContext& ctx);
// y = x @ weight + bias (matmul_bias): one RunGemm with the bias epilogue.
absl::Status MatmulBiasKernel(KernelContext& ctx);
// z = x @ weight + bias and y = GELU(z) (matmul_bias_gelu): one RunGemm with
// the bias + GELU epilogue.
absl::Status MatmulBiasGeluKernel(KernelContext& ctx);

// `batch` independent row-major GEMMs y[i] (m, n) = alpha * op(a[i]) @ op(b[i])
// where op(a[i]) is (m, k) and op(b[i]) is (k, n); a[i] is stored (m, k), or
// (k, m) when transpose_a, b[i] (k, n) or (n, k) when transpose_b, items
// contiguous one after the other. Any extent may be 0 (k = 0 gives zeros).
struct GemmArgs {
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  const float* b = nullptr;
  float* y = nullptr;
  // bf16 inputs instead (a_bf16 / b_bf16 laid out as a / b; y still f32):
  // oneDNN's bf16 matmul, products summed in f32. Callers check
  // CpuHasBf16Gemm() first (elsewhere the inputs are widened to f32).
  const uint16_t* a_bf16 = nullptr;
  const uint16_t* b_bf16 = nullptr;
  // Epilogue, run on each piece's block right after its GEMM (while the
  // block is still in cache): with `bias` (n floats) every row of the block
  // gets bias added; with `gelu` too (1: erf, 2: tanh approximation) the
  // sums go to `aux` (laid out as y) and y = GELU(aux).
  const float* bias = nullptr;
  float* aux = nullptr;
  int gelu = 0;
  // Or with `addend` (laid out as y; not with bias): y = the sums + addend,
  // the bits of the GEMM and then add.
  const float* addend = nullptr;
};

// Whether this CPU multiplies bf16 natively (AVX512-BF16), so that RunGemm's
// bf16 path is worth taking; detected once.
bool CpuHasBf16Gemm();
// Bytes of scratch a GEMM of inputs `a` and `b` takes on this CPU: both
// widened to f32 where it has no native product of their type (f16 always,
// bf16 without AVX512-BF16), else 0. The matmul ops' schemas ask for it as
// their CPU workspace, so the memory plan counts it (a per-call allocation
// outside the plan added 0.5-0.9 GiB to GPT-2 124M's fp16 run, the LM
// head's logits gradient widened).
int64_t GemmWideningBytes(const TensorMeta& a, const TensorMeta& b);

// Runs the GEMMs on ctx's intra-op pool. Every oneDNN call is
// single-threaded: the work is cut over the pool's threads here, and the
// calling threads' OpenMP thread count is set to 1 and left so (why: see
// ops/cpu/matmul.cc). Thread-safe.
absl::Status RunGemm(const KernelContext& ctx, const GemmArgs& args);

// One row-major f32 GEMM on the calling thread only, for kernels that cut
// their own work over the pool (each piece calls this on its own thread):
// y = alpha * op(a) @ op(b) + beta * y, blocks addressed through leading
// dimensions (op(a) m x k, op(b) k x n). Sets the calling thread's OpenMP
// count to 1 (see RunGemm).
absl::Status SgemmOnThisThread(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* y,
                               int64_t ldy);

}  // namespace tessera::ops::cpu
