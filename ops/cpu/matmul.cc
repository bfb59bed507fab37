// GEMM kernels: op(a) is (M, K), op(b) is (K, N), y is (M, N), per batch
// item for batch_matmul (items contiguous).
//
// oneDNN does the arithmetic (dnnl_sgemm: ~95% of one core's FP32 FMA peak on
// large shapes), but always on ONE OpenMP thread; the parallelism is ours:
// batches are shared out by item and single GEMMs cut into blocks of rows
// and/or columns, which the intra-op pool runs, one single-threaded
// dnnl_sgemm per piece. Why not let
// oneDNN thread it with OpenMP (omp_set_num_threads(ctx.num_threads())):
//   - OpenMP's team threads are a second set of workers next to the intra-op
//     pool. After a parallel region they busy-wait (libgomp's default wait
//     policy), taking the cores from the pool's threads that run the next
//     (element-wise) op: measured on 2 cores, a batch of single-threaded
//     GEMMs on the pool right after an OpenMP-threaded GEMM ran at 165-190
//     GFLOP/s instead of ~380.
//   - OMP_WAIT_POLICY=PASSIVE stops that but makes every OpenMP region pay a
//     wake-up: small GEMMs (16 x 128x128x64) fell from 207 to 66 GFLOP/s.
//   - Cut here, large GEMMs run as fast as under oneDNN's own threading or
//     faster, and batches of small ones much faster (bench/gemm_bench.cc
//     prints both; 2 threads, fraction of FMA peak: 4096x768x3072 0.92 vs
//     0.87, 32 x 128x128x64 0.83 vs 0.54), with no second set of threads.

#include "ops/cpu/matmul.h"

#include <dnnl.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "core/status.h"
#include "core/text.h"
#include "ops/cpu/cpu_util.h"
#include "ops/cpu/shape_ops.h"
#include "ops/cpu/vec_math.h"

namespace tessera::ops::cpu {
namespace {

// Below this many multiply-adds a piece is not worth a pool thread's wake-up
// (a few µs): 2^20 MACs take ~10 µs on one AVX-512 core.
constexpr int64_t kMinMacsPerChunk = int64_t{1} << 20;

// One single-threaded row-major GEMM with explicit leading dimensions (so a
// block of rows or columns of a larger matrix can be passed):
// y = alpha * op(a) @ op(b) + beta * y.
absl::Status SgemmBlock(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy,
                        float beta = 0.0f) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {  // an empty sum; BLAS leading-dimension rules reject the call
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) y[i * ldy + j] = beta == 0.0f ? 0.0f : beta * y[i * ldy + j];
    }
    return absl::OkStatus();
  }
  const dnnl_status_t status =
      dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, y, ldy);
  if (status != dnnl_success) {
    return absl::InternalError(
        StrCat("dnnl_sgemm(M=", m, ", N=", n, ", K=", k, ") failed with status ", static_cast<int>(status)));
  }
  return absl::OkStatus();
}

// The bf16 counterpart of SgemmBlock: oneDNN's matmul primitive on bf16
// inputs with an f32 result, single-threaded (the caller's OpenMP count is
// 1). Primitives are made once per shape and thread and kept (a model has a
// few dozen shapes; the cache is emptied past 512).
absl::Status Bf16GemmBlock(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float* y, int64_t ldy) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + n, 0.0f);
    return absl::OkStatus();
  }
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, float>;
  struct Prepared {
    dnnl::memory::desc a, b, y;
    dnnl::matmul matmul;
  };
  try {
    static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    thread_local dnnl::stream stream(engine);
    thread_local std::map<Key, Prepared> cache;
    const Key key{m, n, k, lda, ldb, ldy, transpose_a, transpose_b, alpha};
    auto it = cache.find(key);
    if (it == cache.end()) {
      if (cache.size() >= 512) cache.clear();
      using dims = dnnl::memory::dims;
      using dt = dnnl::memory::data_type;
      const dnnl::memory::desc a_md({m, k}, dt::bf16, transpose_a ? dims{1, lda} : dims{lda, 1});
      const dnnl::memory::desc b_md({k, n}, dt::bf16, transpose_b ? dims{1, ldb} : dims{ldb, 1});
      const dnnl::memory::desc y_md({m, n}, dt::f32, dims{ldy, 1});
      dnnl::primitive_attr attr;
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, y_md), attr, engine);
      it = cache.emplace(key, Prepared{a_md, b_md, y_md, dnnl::matmul(pd)}).first;
    }
    const Prepared& p = it->second;
    dnnl::memory a_mem(p.a, engine, const_cast<uint16_t*>(a));
    dnnl::memory b_mem(p.b, engine, const_cast<uint16_t*>(b));
    dnnl::memory y_mem(p.y, engine, y);
    p.matmul.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, y_mem}});
    stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(StrCat("oneDNN bf16 matmul (M=", m, ", N=", n, ", K=", k, ") failed: ", e.what()));
  }
  return absl::OkStatus();
}

// dst (cols, rows) = src (rows, cols)^T, src with leading dimension `lds`:
// 8 x 8 tiles inside 64 x 64 blocks, so reads and writes each touch a few
// dozen pages at a time.
void Transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 8, kBlock = 64;
  for (int64_t r_block = 0; r_block < rows; r_block += kBlock) {
    const int64_t r_end = std::min(rows, r_block + kBlock);
    for (int64_t c_block = 0; c_block < cols; c_block += kBlock) {
      const int64_t c_end = std::min(cols, c_block + kBlock);
      if (r_end - r_block < kBlock || c_end - c_block < kBlock) {
        for (int64_t r = r_block; r < r_end; ++r) {
          for (int64_t c = c_block; c < c_end; ++c) dst[c * rows + r] = src[r * lds + c];
        }
        continue;
      }
      for (int64_t r0 = r_block; r0 < r_end; r0 += kTile) {
        for (int64_t c0 = c_block; c0 < c_end; c0 += kTile) {
          float tile[kTile][kTile];
          for (int64_t r = 0; r < kTile; ++r) {
            for (int64_t c = 0; c < kTile; ++c) tile[c][r] = src[(r0 + r) * lds + c0 + c];
          }
          for (int64_t c = 0; c < kTile; ++c) {
            for (int64_t r = 0; r < kTile; ++r) dst[(c0 + c) * rows + r0 + r] = tile[c][r];
          }
        }
      }
    }
  }
}

// oneDNN's AVX2 sgemm runs transpose_a with a long K at about half its NN
// speed (measured on AMD EPYC, one core: 8192 x 256 x 1024 TN 34 GFLOP/s, NN
// 85; the tied head's and the FFN's weight gradients are such GEMMs). Those
// pieces go through NN instead, kTransposeRows rows of op(a) at a time: the
// rows are transposed into a per-thread buffer that stays in cache for the
// GEMM that follows (head gradient 127 -> 69 ms). Short-K and small ones
// (attention) are left to oneDNN, which runs them at full speed.
constexpr int64_t kTransposeRows = 128;
bool TransposeAFirst(const GemmArgs& g, int64_t rows, int64_t cols) {
  return g.transpose_a && g.k >= 512 && rows >= 64 && cols >= 64;
}

// The per-thread buffer of TransposeAFirst, at least `floats` long; kept
// between calls (kTransposeRows x K floats: 512 KB at K = 1024).
float* TransposeBuffer(int64_t floats) {
  thread_local std::unique_ptr<float[]> buffer;
  thread_local int64_t size = 0;
  if (size < floats) {
    buffer.reset();
    buffer.reset(new float[static_cast<size_t>(floats)]);
    size = floats;
  }
  return buffer.get();
}

// Rows [row_begin, row_end) x columns [col_begin, col_end) of item `item`'s
// GEMM into g.y.
absl::Status GemmPiece(const GemmArgs& g, int64_t item, int64_t row_begin, int64_t row_end, int64_t col_begin,
                       int64_t col_end) {
  if (g.a_bf16 != nullptr) {
    const uint16_t* a = g.a_bf16 + item * g.m * g.k + (g.transpose_a ? row_begin : row_begin * g.k);
    const uint16_t* b = g.b_bf16 + item * g.k * g.n + (g.transpose_b ? col_begin * g.k : col_begin);
    float* y = g.y + item * g.m * g.n + row_begin * g.n + col_begin;
    return Bf16GemmBlock(g.transpose_a, g.transpose_b, row_end - row_begin, col_end - col_begin, g.k, g.alpha, a,
                         g.transpose_a ? g.m : g.k, b, g.transpose_b ? g.k : g.n, y, g.n);
  }
  const float* a = g.a + item * g.m * g.k;  // (M, K) or (K, M)
  const float* b = g.b + item * g.k * g.n;  // (K, N) or (N, K)
  float* y = g.y + item * g.m * g.n;        // (M, N)
  a += g.transpose_a ? row_begin : row_begin * g.k;
  b += g.transpose_b ? col_begin * g.k : col_begin;
  y += row_begin * g.n + col_begin;
  const int64_t rows = row_end - row_begin, cols = col_end - col_begin;
  const int64_t ldb = g.transpose_b ? g.k : g.n;
  if (TransposeAFirst(g, rows, cols)) {
    float* a_rows = TransposeBuffer(std::min(rows, kTransposeRows) * g.k);
    for (int64_t r = 0; r < rows; r += kTransposeRows) {
      const int64_t n_rows = std::min(kTransposeRows, rows - r);
      Transpose(a + r, g.m, g.k, n_rows, a_rows);  // stored (K, n_rows) of ld M -> (n_rows, K)
      RETURN_IF_ERROR(
          SgemmBlock(false, g.transpose_b, n_rows, cols, g.k, g.alpha, a_rows, g.k, b, ldb, y + r * g.n, g.n));
    }
    return absl::OkStatus();
  }
  return SgemmBlock(g.transpose_a, g.transpose_b, rows, cols, g.k, g.alpha, a, g.transpose_a ? g.m : g.k, b, ldb, y,
                    g.n);
}

// GemmArgs' epilogue over rows [row_begin, row_end) x columns [col_begin,
// col_end) of item `item`, whose GEMM sums are in `sums` (y, or aux with
// GELU). z = sum + bias is formed as bias_gelu forms x + bias, so the two
// give the same bits.
void Epilogue(const GemmArgs& g, float* sums, int64_t item, int64_t row_begin, int64_t row_end, int64_t col_begin,
              int64_t col_end) {
  const float* bias = g.bias + col_begin;
  const int64_t cols = col_end - col_begin;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t offset = (item * g.m + r) * g.n + col_begin;
    float* z = sums + offset;
    float* y = g.y + offset;
    if (g.gelu == 0) {
      for (int64_t c = 0; c < cols; ++c) z[c] += bias[c];
    } else if (g.gelu == 2) {
      for (int64_t c = 0; c < cols; ++c) {
        z[c] += bias[c];
        y[c] = GeluF(z[c], true);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        z[c] += bias[c];
        y[c] = GeluF(z[c], false);
      }
    }
  }
}

// Rows [row_begin, row_end) x columns [col_begin, col_end) of item `item`'s
// output, then the epilogue on them.
absl::Status RunPiece(const GemmArgs& args, int64_t item, int64_t row_begin, int64_t row_end, int64_t col_begin,
                      int64_t col_end) {
  GemmArgs g = args;
  if (g.bias != nullptr && g.gelu != 0) g.y = g.aux;  // the GEMM writes the sums into aux
  RETURN_IF_ERROR(GemmPiece(g, item, row_begin, row_end, col_begin, col_end));
  if (g.bias != nullptr) Epilogue(args, g.y, item, row_begin, row_end, col_begin, col_end);
  if (g.addend != nullptr) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      const int64_t offset = (item * g.m + r) * g.n + col_begin;
      float* y = g.y + offset;
      const float* c = g.addend + offset;
      for (int64_t j = 0; j < col_end - col_begin; ++j) y[j] += c[j];
    }
  }
  return absl::OkStatus();
}

// How one item is cut into pieces: a grid of row_blocks x col_blocks.
struct Grid {
  int64_t row_blocks = 1, col_blocks = 1;
};

// The grid of `pieces` blocks whose blocks are least thin (largest smaller
// side), so every piece keeps the micro-kernel's tiles full; on ties, more
// row blocks (a row block's output rows are contiguous).
Grid ChooseGrid(int64_t m, int64_t n, int64_t pieces) {
  Grid best;
  int64_t best_side = -1;
  for (int64_t rows = pieces; rows >= 1; --rows) {
    if (pieces % rows != 0) continue;
    const int64_t cols = pieces / rows;
    const int64_t side = std::min((m + rows - 1) / rows, (n + cols - 1) / cols);
    if (side > best_side) {
      best_side = side;
      best = {rows, cols};
    }
  }
  return best;
}

// Validates the local tensors of a (batch_)matmul against each other and
// returns the GEMM they describe.
absl::StatusOr<GemmArgs> LocalGemm(const KernelContext& ctx, bool batched) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  const Tensor& y = ctx.output(0);
  const bool low = a.dtype() == DType::kBF16 || a.dtype() == DType::kF16;
  if (!(a.dtype() == DType::kF32 || low) || b.dtype() != a.dtype() || y.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(StrCat("a, b f32, bf16 or f16 alike and y f32, got ", DTypeName(a.dtype()),
                                             ", ", DTypeName(b.dtype()), ", ", DTypeName(y.dtype())));
  }
  const int rank = a.shape().rank();
  const bool rank_ok = batched ? rank >= 3 : rank == 2;
  if (!rank_ok || b.shape().rank() != rank || y.shape().rank() != rank) {
    return absl::InvalidArgumentError(StrCat("local shapes a ", a.shape().ToString(), ", b ", b.shape().ToString(),
                                             ", y ", y.shape().ToString(), " have the wrong ranks"));
  }
  GemmArgs g;
  g.transpose_a = ctx.attr().Bool("transpose_a");
  g.transpose_b = ctx.attr().Bool("transpose_b");
  g.alpha = static_cast<float>(ctx.attr().Float("alpha"));
  const int row = rank - 2, col = rank - 1;
  g.m = a.shape()[g.transpose_a ? col : row];
  g.k = a.shape()[g.transpose_a ? row : col];
  g.n = b.shape()[g.transpose_b ? row : col];
  const int64_t k_b = b.shape()[g.transpose_b ? col : row];
  bool batch_ok = true;
  for (int i = 0; i < row; ++i) {
    batch_ok = batch_ok && a.shape()[i] == b.shape()[i] && a.shape()[i] == y.shape()[i];
    g.batch *= a.shape()[i];
  }
  if (!batch_ok || k_b != g.k || y.shape()[row] != g.m || y.shape()[col] != g.n) {
    return absl::InvalidArgumentError(StrCat("local shapes a ", a.shape().ToString(), ", b ", b.shape().ToString(),
                                             ", y ", y.shape().ToString(), " do not match (transpose_a=", g.transpose_a,
                                             ", transpose_b=", g.transpose_b, ")"));
  }
  g.y = y.data<float>();
  return g;
}

// Floats of room for `elements` widened values, whole cache lines.
int64_t WidenedFloats(int64_t elements) { return (elements + 15) / 16 * 16; }

// RunGemm on inputs a, b of any GEMM dtype (f32, bf16 or f16 alike; g
// holds everything else).
absl::Status RunGemmOn(const KernelContext& ctx, GemmArgs g, const Tensor& a, const Tensor& b) {
  if (a.dtype() == DType::kF32) {
    g.a = a.data<float>();
    g.b = b.data<float>();
    return RunGemm(ctx, g);
  }
  if (a.dtype() == DType::kBF16 && CpuHasBf16Gemm()) {
    g.a_bf16 = static_cast<const uint16_t*>(a.raw_data());
    g.b_bf16 = static_cast<const uint16_t*>(b.raw_data());
    return RunGemm(ctx, g);
  }
  // No native low-precision products here: the same sums of exact products
  // in f32 (f16 always: no x86 CPU here multiplies f16 through oneDNN),
  // widened into the planned workspace (GemmWideningBytes), or memory of
  // their own where the plan has none (a plan made on a CPU with native bf16
  // products, an eager call).
  const int64_t a_floats = WidenedFloats(a.NumElements()), b_floats = WidenedFloats(b.NumElements());
  std::unique_ptr<float[]> own;
  float* room = nullptr;
  if (ctx.workspace.defined() && static_cast<int64_t>(ctx.workspace.NumBytes()) >= (a_floats + b_floats) * 4) {
    room = static_cast<float*>(ctx.workspace.raw_data());
  } else {
    own.reset(new float[static_cast<size_t>(a_floats + b_floats)]);  // not zeroed: all written
    room = own.get();
  }
  WidenTo(ctx, a, room);
  WidenTo(ctx, b, room + a_floats);
  g.a = room;
  g.b = room + a_floats;
  return RunGemm(ctx, g);
}

absl::Status GemmKernel(KernelContext& ctx, bool batched) {
  ASSIGN_OR_RETURN(GemmArgs g, LocalGemm(ctx, batched));
  return RunGemmOn(ctx, g, ctx.input(0), ctx.input(1));
}

}  // namespace

absl::Status RunGemm(const KernelContext& ctx, const GemmArgs& g) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return absl::OkStatus();
  const int64_t macs = g.batch * g.m * g.n * std::max<int64_t>(g.k, 1);
  const int64_t chunks = std::clamp<int64_t>(macs / kMinMacsPerChunk, 1, ctx.num_threads());
  // Work units, `pieces` per item. Whole items (one dnnl_sgemm each, nothing
  // packed twice) when they share out evenly over the chunks, or nearly so
  // (at least 8 per chunk: the largest chunk then has at most 1/8 more than
  // the mean): batched attention. Otherwise every item is cut into `chunks`
  // pieces so each chunk gets an equal share of every item: one large GEMM
  // becomes one piece per thread.
  const bool whole_items = g.batch % chunks == 0 || g.batch >= 8 * chunks;
  const int64_t pieces = whole_items ? 1 : chunks;
  const Grid grid = ChooseGrid(g.m, g.n, pieces);
  const int64_t units = g.batch * pieces;
  FirstError error;
  ParallelFor(ctx, units, (units + chunks - 1) / chunks, [&](int64_t begin, int64_t end) {
    // oneDNN threads with OpenMP up to this thread's OpenMP count, which
    // defaults to the core count: keep each call on this thread.
    omp_set_num_threads(1);
    for (int64_t unit = begin; unit < end;) {
      // The run of units in this chunk on one item and one row block: a
      // single call over their joined columns.
      const int64_t item = unit / pieces, row_block = unit % pieces / grid.col_blocks;
      const int64_t col_block = unit % pieces % grid.col_blocks;
      const int64_t run = std::min(end - unit, grid.col_blocks - col_block);
      absl::Status status =
          RunPiece(g, item, row_block * g.m / grid.row_blocks, (row_block + 1) * g.m / grid.row_blocks,
                   col_block * g.n / grid.col_blocks, (col_block + run) * g.n / grid.col_blocks);
      if (!status.ok()) return error.Note(status);
      unit += run;
    }
  });
  return error.Take();
}

int64_t GemmWideningBytes(const TensorMeta& a, const TensorMeta& b) {
  if (a.dtype == DType::kF32 || (a.dtype == DType::kBF16 && CpuHasBf16Gemm())) return 0;
  if (a.dtype != DType::kBF16 && a.dtype != DType::kF16) return 0;
  return (WidenedFloats(a.shape.NumElements()) + WidenedFloats(b.shape.NumElements())) * 4;
}

bool CpuHasBf16Gemm() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return has;
}

absl::Status SgemmOnThisThread(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* y,
                               int64_t ldy) {
  omp_set_num_threads(1);
  return SgemmBlock(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, y, ldy, beta);
}

absl::Status MatmulKernel(KernelContext& ctx) { return GemmKernel(ctx, /*batched=*/false); }

absl::Status BatchMatmulKernel(KernelContext& ctx) { return GemmKernel(ctx, /*batched=*/true); }

absl::Status MatmulAddKernel(KernelContext& ctx) {
  ASSIGN_OR_RETURN(GemmArgs g, LocalGemm(ctx, /*batched=*/false));
  const Tensor& c = ctx.input(2);
  if (c.dtype() != DType::kF32 || c.shape() != ctx.output(0).shape()) {
    return absl::InvalidArgumentError(
        StrCat("local addend c ", c.meta().ToString(), " does not match y ", ctx.output(0).meta().ToString()));
  }
  g.addend = c.data<float>();
  return RunGemmOn(ctx, g, ctx.input(0), ctx.input(1));
}

namespace {

// matmul_bias (gelu false: y = x @ weight + bias) and matmul_bias_gelu (z =
// that, y = GELU(z)): one RunGemm with the bias (+ GELU) epilogue.
absl::Status LinearKernel(KernelContext& ctx, bool gelu) {
  const Tensor &x = ctx.input(0), &w = ctx.input(1), &bias = ctx.input(2);
  const Tensor& y = ctx.output(0);
  const Tensor& z = gelu ? ctx.output(1) : y;
  const bool low = x.dtype() == DType::kBF16 || x.dtype() == DType::kF16;
  if (!(x.dtype() == DType::kF32 || low) || w.dtype() != x.dtype() || bias.dtype() != DType::kF32 ||
      y.dtype() != DType::kF32 || z.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(StrCat("x, weight f32, bf16 or f16 alike and bias, ", gelu ? "y, z" : "y",
                                             " f32, got ", DTypeName(x.dtype()), ", ", DTypeName(w.dtype()), ", ",
                                             DTypeName(bias.dtype()), ", ", DTypeName(y.dtype()),
                                             gelu ? StrCat(", ", DTypeName(z.dtype())) : ""));
  }
  const bool shapes_ok = x.shape().rank() == 2 && w.shape().rank() == 2 && w.shape()[0] == x.shape()[1] &&
                         bias.shape() == Shape{w.shape()[1]} && y.shape() == Shape{x.shape()[0], w.shape()[1]} &&
                         z.shape() == y.shape();
  if (!shapes_ok) {
    return absl::InvalidArgumentError(StrCat("local shapes x ", x.shape().ToString(), ", weight ", w.shape().ToString(),
                                             ", bias ", bias.shape().ToString(), ", y ", y.shape().ToString(),
                                             gelu ? StrCat(", z ", z.shape().ToString()) : "", " do not match"));
  }
  GemmArgs g;
  g.m = x.shape()[0];
  g.k = x.shape()[1];
  g.n = w.shape()[1];
  g.y = y.data<float>();
  g.bias = bias.data<float>();
  if (gelu) {
    g.aux = z.data<float>();
    g.gelu = ctx.attr().String("approximate") == "tanh" ? 2 : 1;
  }
  return RunGemmOn(ctx, g, x, w);
}

}  // namespace

absl::Status MatmulBiasKernel(KernelContext& ctx) { return LinearKernel(ctx, /*gelu=*/false); }

absl::Status MatmulBiasGeluKernel(KernelContext& ctx) { return LinearKernel(ctx, /*gelu=*/true); }

}  // namespace tessera::ops::cpu
