#pragma once
// Launchers of the CUDA kernels (ops/cuda/*.cu), in
// plain C++ so that host code includes them without the CUDA headers, and
// the few runtime calls the host side needs. Every launcher launches on the
// stream BindStream bound on the calling thread and returns without waiting,
// or, when none is bound, on the thread's default stream
// (cudaStreamPerThread), waiting for the kernel. Each returns a cudaError_t
// as an int: 0 is success, ErrorString names it.
// Kinds are the CPU kernels' enums (ops/cpu/elementwise.h) as ints.

#include <cstddef>
#include <cstdint>

#include "ops/attention_shape.h"
#include "ops/update_formulas.h"

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

// Row kernels over the last axis: `rows` rows of C contiguous floats.
// Softmax (log_softmax when `log`), and its gradient from y and dy.
int LaunchSoftmax(const float* x, float* y, int64_t rows, int64_t C, bool log);
int LaunchSoftmaxGrad(const float* y, const float* dy, float* dx, int64_t rows, int64_t C, bool log);
// Attention probabilities y = softmax(scale * x) over the keys of scores
// x (..., T, S) (`dims`, rank >= 2): keys dropped where `mask` (bytes, null:
// none; mask_strides: its element strides over x's axes, 0 where it
// broadcasts) is 0 and, when causal, past t_offset + t + diagonal for the
// row's query t; a row with no key left is zeros.
struct AttentionLayout {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t mask_strides[kMaxRank] = {};
};
int LaunchScaleMaskSoftmax(const float* x, float* y, const uint8_t* mask, const AttentionLayout& layout, bool causal,
                           int64_t t_offset, int64_t diagonal, float scale);
int LaunchLayerNorm(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                    int64_t rows, int64_t C, float eps);
// Layer norm's gradient: dx per row; dgamma and dbeta are column sums
// over ranges of rows (ops/reduce_chunks.h) whose double partials go to
// `workspace` when it holds NormParamGradWorkspaceBytes, else to memory of
// the call's own.
// With `addend` (null: none) dx + addend, the sum rounded on its own.
int LaunchLayerNormGrad(const float* dy, const float* x, const float* mean, const float* rstd, const float* gamma,
                        float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C, void* workspace,
                        size_t workspace_bytes, const float* addend = nullptr);

// Optimizer steps over n elements; outputs may alias inputs (each element
// is read before it is written). lr, skip and skipped (null: absent) are
// one float each in device memory, read by the kernel, so the host never
// waits for the stream: a nonzero skip copies the inputs to the outputs;
// AdamW's step t = step + 1 - skipped, its scalars formed as the CPU forms
// them (AdamwStepScalars, in double).
int LaunchSgd(const float* param, const float* grad, const float* buf, float* new_param, float* new_buf, int64_t n,
              const float* lr, const float* skip, float momentum, float weight_decay, bool nesterov);
int LaunchAdamw(const float* param, const float* grad, const float* m, const float* v, float* new_param, float* new_m,
                float* new_v, int64_t n, const float* lr, const float* skip, const float* skipped, int64_t step,
                const AdamwHyper& hyper);

// y = alpha * op(a) @ op(b) for `batch` row-major matrices one after
// another (a: M x K, or K x M when ta; b: K x N, or N x K when tb; y: M x N
// f32), through cuBLASLt (with up to `workspace_bytes` at `workspace`;
// null: none) on the calling thread's handle for the current device, or
// cuBLAS where cuBLASLt has no algorithm for the types and alignments,
// summed in f32 (no TF32). a_dtype: 0 f32, 1 bf16, 2 f16 (a and b alike).
// A cuBLAS(Lt) failure returns -(cublasStatus_t).
// With `addend` (laid out as y; may be y itself) y = alpha · op(a) op(b) +
// addend: cuBLASLt's C with beta 1 (cuBLAS's, in place, after a copy).
int LaunchGemm(int a_dtype, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
               const void* a, const void* b, float* y, void* workspace, size_t workspace_bytes,
               const float* addend = nullptr);
// z = x @ w + bias for row-major x (M x K) and w (K x N) of x_dtype (as
// LaunchGemm's), f32 bias (N), z (M x N): one cublasLtMatmul with the bias
// as its epilogue; with y non-null also y = GELU(z) in the epilogue
// (GELU_AUX_BIAS, z its auxiliary output), cuBLASLt's GELU being the tanh
// approximation. Sets *fused when it ran; when cuBLASLt has no kernel for it
// (an empty extent; N not a multiple of 8 with GELU; no algorithm for these
// types and alignments) it returns 0 with *fused false and writes nothing.
// cuBLASLt may use `workspace_bytes` at `workspace` (null: none; aligned
// up to 256 bytes here).
int LaunchGemmBiasLt(int x_dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, const float* bias,
                     float* z, float* y, void* workspace, size_t workspace_bytes, bool* fused);

// Every element of dst (n elements of `elem` bytes: 1, 2, 4 or 8) set to
// the low `elem` bytes of `bits` (fill, zeros, ones).
int LaunchFillBits(void* dst, int64_t n, int elem, uint64_t bits);
// out = cond ? a : b element by element over `dims` (row-major), each
// operand read through its strides (0 where it broadcasts), elements of
// `elem` bytes; a null `a` stands for the constant `a_bits` (masked_fill).
struct SelectLayout {
  int rank = 0;
  int elem = 4;
  int64_t dims[kMaxRank] = {};
  int64_t cond_strides[kMaxRank] = {};
  int64_t a_strides[kMaxRank] = {};
  int64_t b_strides[kMaxRank] = {};
};
int LaunchSelect(const uint8_t* cond, const void* a, uint64_t a_bits, const void* b, void* out,
                 const SelectLayout& layout);
// RMS norm over rows of C (ops/cpu/norm_softmax.cc's formulas): y = x ·
// rstd · gamma, rstd = 1 / sqrt(mean(x²) + eps); the gradient dx = rstd ·
// (dy·gamma - xhat · mean(dy·gamma·xhat)) and dgamma = Σ_rows dy · xhat
// (per column, over ranges of rows as LaunchLayerNormGrad's).
int LaunchRmsNorm(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C, float eps);
int LaunchRmsNormGrad(const float* dy, const float* x, const float* rstd, const float* gamma, float* dx, float* dgamma,
                      int64_t rows, int64_t C, void* workspace, size_t workspace_bytes);
// Cross-entropy per row of (N, V) logits against checked i64 labels:
// loss = logsumexp - logit[label]; dlogits = (softmax - onehot) · dloss.
int LaunchSparseCrossEntropy(const float* logits, const int64_t* labels, float* loss, int64_t N, int64_t V);
int LaunchSparseCrossEntropyGrad(const float* logits, const int64_t* labels, const float* dloss, float* dlogits,
                                 int64_t N, int64_t V);

// Fused attention (ops/attention.cc) on contiguous q (B, H, T, D), k, v
// (B, H, S, D): y and lse (B, H, T) forward; dq, dk, dv backward from the
// saved lse (B·H·T floats of workspace hold Σ dy ⊙ y).
// f32 (attention.cu): one warp per query (forward, dq) or key (dk, dv) row,
// key or query tiles of 32 rows in shared memory; every sum has one order (no atomics). Head
// dims up to kMaxAttentionHeadDim (the host side refuses more).
inline constexpr int64_t kMaxAttentionHeadDim = 128;
int LaunchFlashAttention(const float* q, const float* k, const float* v, float* y, float* lse,
                         const AttentionShape& shape);
// `delta`: B·H·T floats of workspace, or null (a stream-ordered temporary).
int LaunchFlashAttentionGrad(const float* q, const float* k, const float* v, const float* y, const float* lse,
                             const float* dy, float* dq, float* dk, float* dv, float* delta,
                             const AttentionShape& shape);
// The same for bf16 (`bf16`) or f16 q, k, v on tensor cores
// (attention_tc.cu): y, lse, dy f32; dq, dk, dv in q's type. Blocks of 64
// query (forward, dq) or key (dk, dv) rows, a warp per 16; products
// through mma.sync (sm_80 and up) with f32 accumulators.
int LaunchFlashAttention16(bool bf16, const void* q, const void* k, const void* v, float* y, float* lse,
                           const AttentionShape& shape);
int LaunchFlashAttentionGrad16(bool bf16, const void* q, const void* k, const void* v, const float* y, const float* lse,
                               const float* dy, void* dq, void* dk, void* dv, float* delta,
                               const AttentionShape& shape);

// dst[dst_base + Σ c_d dst_strides[d]] = src[src_base + Σ c_d src_strides[d]]
// for every coordinate c of `dims` (in elements of `elem` bytes: 1, 2, 4 or
// 8): transposes, broadcasts, blocks of slices and concatenations.
struct StridedCopy {
  int rank = 0;
  int elem = 4;
  int64_t dims[kMaxRank] = {};
  int64_t src_strides[kMaxRank] = {};
  int64_t dst_strides[kMaxRank] = {};
  int64_t src_base = 0, dst_base = 0;
};
int LaunchStridedCopy(const void* src, void* dst, const StridedCopy& copy);
// Sets `bytes` bytes at dst to 0.
int Zero(void* dst, size_t bytes);

// Reductions: y[o] = scale * Σ (or max, or Σ of squares) over the reduced
// coordinates r of x[Σ kept_o · kept_strides + Σ r · reduced_strides], one
// output per kept coordinate (row-major). kind: 0 sum, 1 max, 2 sum of
// squares (accumulated in double). x is f32 (x_dtype 0), or bf16 (1) or
// f16 (2), each element widened exactly. An empty reduction gives 0 · scale or
// -inf. A long reduction is cut into ranges (ops/reduce_chunks.h) whose
// double partials go to `workspace` when it holds ReducePartialBytes, else
// to memory of the call's own.
struct ReduceLayout {
  int kept_rank = 0, reduced_rank = 0;
  int64_t kept_dims[kMaxRank] = {}, kept_strides[kMaxRank] = {};
  int64_t reduced_dims[kMaxRank] = {}, reduced_strides[kMaxRank] = {};
};
int LaunchReduce(int kind, int x_dtype, const void* x, float* y, const ReduceLayout& layout, float scale,
                 void* workspace, size_t workspace_bytes);
// reduce_max's gradient over the same layout: dx at each coordinate is
// dy[o] / ties[o] where x equals y[o] (ties[o]: how many do), else 0.
int LaunchReduceMaxGrad(const float* x, const float* y, const float* dy, float* dx, const ReduceLayout& layout);
// y[o] (i64) = the reduced coordinate of the max of x (one reduced axis),
// the lowest among ties; NaN is skipped, as the CPU's max; 0 for a row of NaN.
int LaunchArgmax(const float* x, int64_t* y, const ReduceLayout& layout);
// The k largest of each of `rows` contiguous rows of n, descending, ties by
// lower index, NaN last: values (rows x k) and their indices (i64).
int LaunchTopK(const float* x, float* values, int64_t* indices, int64_t rows, int64_t n, int64_t k);

// dx = dy * gelu'(x + bias), bias over rows of C (tanh: the approximation).
int LaunchBiasGeluGrad(const float* x, const float* bias, const float* dy, float* dx, int64_t rows, int64_t C,
                       bool tanh);

// Embedding rows of this shard's weight (V rows from logical row row_begin,
// C channels) for N ids (i32 when id_bytes is 4, else i64); ids of other
// shards give zeros. Every id must lie in [0, vocab): *bad is the first
// position that does not (-1: none), checked before anything is written.
int LaunchEmbedding(const float* weight, const void* ids, int id_bytes, float* y, int64_t N, int64_t V, int64_t C,
                    int64_t row_begin, int64_t vocab, int64_t* bad);
// dweight (V x C) = Σ of dy's rows over the ids naming each row, summed in
// id order (as the CPU: the same bits); *bad as above.
int LaunchEmbeddingGrad(const float* dy, const void* ids, int id_bytes, float* dweight, int64_t N, int64_t V,
                        int64_t C, int64_t row_begin, int64_t vocab, int64_t* bad);

// Vocabulary-parallel cross-entropy pieces over logits (N, Vs) whose first
// column is global id `offset`; labels are device i64, already checked.
int LaunchCrossEntropyPartials(const float* logits, const float* row_max, const int64_t* labels, float* sumexp,
                               float* label_logit, int64_t N, int64_t Vs, int64_t offset);
// dlogits of `dlogits_dtype` (0: f32, 1: bf16, 2: f16; rounded to nearest
// even as cast rounds).
int LaunchCrossEntropyPartialsGrad(const float* logits, const float* row_max, const int64_t* labels,
                                   const float* d_sumexp, const float* d_label_logit, void* dlogits, int dlogits_dtype,
                                   int64_t N, int64_t Vs, int64_t offset);

// The random ops draw by global index (ops/cpu/random.cc's rule): element
// p of the shard is element p % run_length of run p / run_length, whose
// global start g0 is base + Σ (run's coordinates over outer_local) ·
// outer_strides; element g takes Philox word g % 4 of block g / 4 (key
// seed, counter high words tensor_id and step).
struct RandomRuns {
  int outer_rank = 0;
  int64_t run_length = 1, base = 0;
  int64_t outer_local[kMaxRank] = {}, outer_strides[kMaxRank] = {};
};
// Dropout keeps x (times scale) where the word's 24 high bits reach
// threshold.
int LaunchDropout(const float* x, float* y, int64_t n, uint64_t seed, uint32_t tensor_id, uint32_t step,
                  int32_t threshold, float scale, const RandomRuns& runs);
// bias_dropout_add: y = residual + (x + bias[p % C]) · mask, the mask as
// LaunchDropout's (none when drop is false), each operation rounded on its
// own (no FMA), as the three unfused ops.
int LaunchBiasDropoutAdd(const float* x, const float* bias, const float* residual, float* y, int64_t n, int64_t C,
                         bool drop, uint64_t seed, uint32_t tensor_id, uint32_t step, int32_t threshold, float scale,
                         const RandomRuns& runs);
// uniform: min(low + span · u, below_high), u = the 24 high bits / 2^24;
// normal: Box–Muller on the block's word pairs (2j, 2j + 1):
// mean + stddev · sqrt(-2 ln u1) · (cos, sin)(2π u2), u1 = (bits + 1) / 2^24,
// lane 2j the cos branch and 2j + 1 the sin one. The Philox words are the
// CPU's; the values agree to float rounding, not bit for bit (either
// compiler may fuse a multiply-add; CUDA's logf and sincospif against the
// CPU's polynomials).
int LaunchUniform(float* y, int64_t n, uint64_t seed, uint32_t tensor_id, uint32_t step, float low, float span,
                  float below_high, const RandomRuns& runs);
int LaunchNormal(float* y, int64_t n, uint64_t seed, uint32_t tensor_id, uint32_t step, float mean, float stddev,
                 const RandomRuns& runs);

// y = x converted element by element, as ops/cpu/shape_ops.cc's Cast:
// floats round to nearest even, integers to 16-bit floats in one rounding,
// floats to integers truncate and saturate (NaN -> 0), integers narrow by
// wrapping, bool is x != 0. Type codes: 0 f32, 1 f16, 2 bf16, 3 i32, 4 i64,
// 5 bool.
int LaunchCast(const void* x, int from, void* y, int to, int64_t n);
// y[i] = fma(offset + i, step, start) in double, stored in `dtype` (a
// LaunchCast type code, not bool) as ops/cpu/shape_ops.cc's Arange stores it.
int LaunchArange(void* y, int dtype, int64_t n, double start, double step, int64_t offset);

// *flag (an f32 on the device) = 1 when any of the n elements of x (code 0
// f32, 1 f16, 2 bf16) is NaN or infinite, else 0.
int LaunchNonfinite(const void* x, int code, int64_t n, float* flag);
// fp16's loss scale step (ops/cpu/optimizer.cc LossScaleUpdateKernel), on
// device scalars: halve (backoff) on overflow, grow after growth_interval
// clean steps in a row.
int LaunchLossScaleUpdate(const float* scale, const float* found_inf, const float* good, float* new_scale,
                          float* new_good, double backoff, double growth, int64_t growth_interval);

// The visible CUDA devices (0 with an error code when the driver has none).
int DeviceCount(int* count);
// Makes `device` current on the calling thread.
int SetDevice(int device);
// Copies `bytes` between device buffers on the bound stream without waiting
// (as the launchers: waited for only on the thread's default stream).
int CopyOnStream(void* dst, const void* src, size_t bytes);
// Binds the stream (a cudaStream_t; null: none) the calling thread's
// launches go on, until the next BindStream on this thread.
void BindStream(void* stream);
// Copies `bytes` between any two pointers (host or device) on the bound
// stream (behind the kernels launched on it), then waits.
int Copy(void* dst, const void* src, size_t bytes);
// Copies `bytes` of a buffer that is already complete (an input register:
// its producer's kernels finished before it was handed on) on the calling
// thread's default stream of the current device, waiting for that copy
// alone: the host does not wait for the kernels queued on the bound stream.
int CopyReady(void* dst, const void* src, size_t bytes);
// Queues host function fn(data) on `stream` (a cudaStream_t): it runs when
// the work before it has, and the work after it waits for it.
int LaunchHostFunc(void* stream, void (*fn)(void*), void* data);
// Names a launcher's error: a cudaError_t, or -(cublasStatus_t).
const char* ErrorString(int code);
// Starts cuBLAS and cuBLASLt on `device` (the calling thread's handles for
// it, which it keeps; its current device is left as it was). The runtime
// calls it when it loads a plan, before any collective is queued: a
// library's start loads its modules into the GPU's context (all of them
// under eager module loading), which may wait for everything queued on the
// GPU, an NCCL collective waiting for its peers included.
int PrepareLibraries(int device);
// How many cuBLAS and cuBLASLt handles the process has made for `device`:
// threads take them from a pool and give them back when they exit, so a
// long-lived process makes no more than it has threads using the GPU at once.
int CublasHandlesMade(int device);

}  // namespace tessera::ops::cuda
