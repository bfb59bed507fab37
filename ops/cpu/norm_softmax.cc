#include "ops/cpu/norm_softmax.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/cpu/cpu_util.h"

namespace tessera::ops::cpu {
namespace {

// Shape letters: C is the normalised (last) axis and R = numel / C the number
// of rows before it. The fused attention softmax views its input as
// (..., T, S): T queries (rows), S keys (the normalised axis).

struct RowView {
  int64_t rows = 0;
  int64_t cols = 0;
};

RowView RowsOf(const Tensor& t) {
  const int rank = t.shape().rank();
  const int64_t cols = rank == 0 ? 1 : t.shape()[rank - 1];
  return {cols == 0 ? 0 : t.NumElements() / cols, cols};
}

// Parameter gradients (dgamma, dbeta) sum over every row, in blocks of
// kNormRowBlock rows (ops/cpu/norm_softmax.h): a number fixed by the rows
// alone, each accumulating into its own scratch row (so no two threads
// write the same floats), added at the end in double in block order. The
// sums are then the same bits whatever the thread count (so whatever the
// threads a layout gives each device), and a long sum over B·T rows loses no
// more than one of kNormRowBlock.

// The scratch rows (blocks, width), each zeroed by its block: the workspace
// when the plan gave one, else `own`.
float* ScratchRows(const KernelContext& ctx, int64_t blocks, int64_t width, std::vector<float>& own) {
  const int64_t n = blocks * width;
  if (ctx.workspace.defined() && static_cast<int64_t>(ctx.workspace.NumBytes()) >= n * 4) {
    return static_cast<float*>(ctx.workspace.raw_data());
  }
  own.resize(static_cast<size_t>(n));
  return own.data();
}

// Rows [first, end) of block b.
Range BlockRows(int64_t rows, int64_t b) {
  const int64_t first = b * kNormRowBlock;
  return {first, std::min(rows, first + kNormRowBlock) - first};
}

// Blocks per task: about kElementwiseGrain elements of work each, so few or
// short rows stay on one thread (a wake-up costs more).
int64_t BlockGrain(int64_t cols) {
  return std::max<int64_t>(1, kElementwiseGrain / (kNormRowBlock * std::max<int64_t>(1, cols)));
}

// out[j] = Σ_b partial[b * stride + j] for j < cols, added in double in
// block order.
void SumBlocks(const KernelContext& ctx, const float* partial, int64_t blocks, int64_t stride, int64_t cols,
               float* out) {
  ParallelFor(ctx, cols, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    std::vector<double> total(static_cast<size_t>(end - begin), 0.0);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* p = partial + b * stride + begin;
      for (int64_t j = 0; j < end - begin; ++j) total[static_cast<size_t>(j)] += p[j];
    }
    for (int64_t j = begin; j < end; ++j) out[j] = static_cast<float>(total[static_cast<size_t>(j - begin)]);
  });
}

// One row of layer_norm_grad: dx, and this row's share of dgamma and dbeta.
// Separate function for __restrict: with six pointers GCC would need more
// runtime alias checks than it is willing to emit, and stay scalar.
void LayerNormGradRow(const float* __restrict dy, const float* __restrict x, const float* __restrict gamma, float mu,
                      float rs, float mean_g, float mean_gx, float* __restrict dx, float* __restrict dgamma,
                      float* __restrict dbeta, int64_t C) {
  for (int64_t j = 0; j < C; ++j) {
    const float xhat = (x[j] - mu) * rs;
    dx[j] = rs * (dy[j] * gamma[j] - mean_g - xhat * mean_gx);
    dgamma[j] += dy[j] * xhat;
    dbeta[j] += dy[j];
  }
}

void RmsNormGradRow(const float* __restrict dy, const float* __restrict x, const float* __restrict gamma, float rs,
                    float mean_gx, float* __restrict dx, float* __restrict dgamma, int64_t C) {
  for (int64_t j = 0; j < C; ++j) {
    const float xhat = x[j] * rs;
    dx[j] = rs * (dy[j] * gamma[j] - xhat * mean_gx);
    dgamma[j] += dy[j] * xhat;
  }
}

// Softmax of one row in place: y holds the (scaled, masked) logits on entry.
// A row whose every entry is -inf (fully masked) becomes zeros, not NaN.
void SoftmaxRowInPlace(float* y, int64_t n) {
  const float m = RowMax(y, n);
  if (m == -INFINITY) {
    std::fill(y, y + n, 0.0f);
    return;
  }
  const float inv = 1.0f / ExpShiftedRow(y, m, y, n);
  for (int64_t j = 0; j < n; ++j) y[j] *= inv;
}

// y[j] = scale * x[j] for keys j < limit that `keep` (null: all) marks, -inf
// elsewhere. The causal limit splits the loop rather than being tested per
// key, which keeps both halves vectorisable.
void ScaleMaskRow(const float* x, const uint8_t* keep, float scale, int64_t limit, float* y, int64_t S) {
  int64_t j = 0;
  if (keep != nullptr) {
    for (; j < limit; ++j) y[j] = keep[j] != 0 ? x[j] * scale : -INFINITY;
  } else {
    for (; j < limit; ++j) y[j] = x[j] * scale;
  }
  for (; j < S; ++j) y[j] = -INFINITY;
}

// The fused attention softmax: y = softmax(scale * x) over keys, with keys
// dropped where `mask` (bool, broadcastable to x; null = none) is false and,
// when causal, where key s lies after query t: s > t + (S - T) in global
// positions, which is why T's offset comes from the input slice (x may be
// split along T).
absl::Status ScaleMaskSoftmax(KernelContext& ctx, const Tensor* mask, float scale, bool causal) {
  const Tensor& x_tensor = ctx.input(0);
  const int rank = x_tensor.shape().rank();
  const std::vector<int64_t>& dims = x_tensor.shape().dims();
  const int64_t S = dims[static_cast<size_t>(rank - 1)];
  const TensorSlice slice = ctx.input_slice(0);
  const int64_t t_offset = slice.offset[static_cast<size_t>(rank - 2)];
  const int64_t diagonal = slice.logical[rank - 1] - slice.logical[rank - 2];  // S - T, logical
  const int64_t R = S == 0 ? 0 : x_tensor.NumElements() / S;                   // rows: (..., T)

  // Element stride of the mask along each axis of x; 0 where it broadcasts.
  std::vector<int64_t> mask_stride(static_cast<size_t>(rank), 0);
  // The mask read as bytes: GCC vectorises byte loads but not bool ones.
  const uint8_t* mask_bytes = nullptr;
  if (mask != nullptr) {
    mask_bytes = reinterpret_cast<const uint8_t*>(mask->data<bool>());
    const Shape& ms = mask->shape();
    const std::vector<int64_t> strides = ms.Strides();
    const int lead = rank - ms.rank();
    for (int a = lead; a < rank; ++a) {
      if (ms[a - lead] != 1) mask_stride[static_cast<size_t>(a)] = strides[static_cast<size_t>(a - lead)];
    }
  }
  const bool mask_along_keys = mask_stride[static_cast<size_t>(rank - 1)] != 0;

  const float* x = x_tensor.data<float>();  // (..., T, S)
  float* y = ctx.output(0).data<float>();   // (..., T, S)
  ParallelFor(ctx, R, RowGrain(S), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      // Row r's coordinates over the axes before S give its query t and mask row.
      int64_t rest = r, mask_offset = 0, t = 0;
      for (int a = rank - 2; a >= 0; --a) {
        const int64_t extent = dims[static_cast<size_t>(a)];
        const int64_t coord = rest % extent;
        rest /= extent;
        mask_offset += coord * mask_stride[static_cast<size_t>(a)];
        if (a == rank - 2) t = coord;
      }
      // Keys [0, limit) pass the causal test.
      int64_t limit = causal ? std::clamp<int64_t>(t_offset + t + diagonal + 1, 0, S) : S;
      if (mask_bytes != nullptr && !mask_along_keys && mask_bytes[mask_offset] == 0) limit = 0;
      float* yr = y + r * S;
      ScaleMaskRow(x + r * S, mask_along_keys ? mask_bytes + mask_offset : nullptr, scale, limit, yr, S);
      SoftmaxRowInPlace(yr, S);
    }
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status SoftmaxKernel(KernelContext& ctx) {
  const RowView v = RowsOf(ctx.input(0));
  const int64_t C = v.cols;
  const float* x = ctx.input(0).data<float>();  // (R, C)
  float* y = ctx.output(0).data<float>();       // (R, C)
  // Three passes per row (max; exp, store and sum; scale), the row in cache
  // after the first: memory sees one read of x and one write of y.
  ParallelFor(ctx, v.rows, RowGrain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      const float m = RowMax(xr, C);
      const float inv = 1.0f / ExpShiftedRow(xr, m, yr, C);
      for (int64_t j = 0; j < C; ++j) yr[j] *= inv;
    }
  });
  return absl::OkStatus();
}

absl::Status LogSoftmaxKernel(KernelContext& ctx) {
  const RowView v = RowsOf(ctx.input(0));
  const int64_t C = v.cols;
  const float* x = ctx.input(0).data<float>();  // (R, C)
  float* y = ctx.output(0).data<float>();       // (R, C)
  ParallelFor(ctx, v.rows, RowGrain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      const float m = RowMax(xr, C);
      // (x - m) - log Σ exp(x - m): m + log Σ, rounded first, would lose
      // the low bits of the sum's log when m is large.
      const float log_sum = LogF(RowSumExp(xr, m, C));
      for (int64_t j = 0; j < C; ++j) yr[j] = (xr[j] - m) - log_sum;
    }
  });
  return absl::OkStatus();
}

absl::Status SoftmaxGradKernel(KernelContext& ctx) {
  const RowView v = RowsOf(ctx.input(0));
  const int64_t C = v.cols;
  const float* y = ctx.input(0).data<float>();   // (R, C)
  const float* dy = ctx.input(1).data<float>();  // (R, C)
  float* dx = ctx.output(0).data<float>();       // (R, C)
  ParallelFor(ctx, v.rows, RowGrain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* yr = y + r * C;
      const float* dyr = dy + r * C;
      float* dxr = dx + r * C;
      const float dot = RowDot(yr, dyr, C);
      for (int64_t j = 0; j < C; ++j) dxr[j] = yr[j] * (dyr[j] - dot);
    }
  });
  return absl::OkStatus();
}

absl::Status LogSoftmaxGradKernel(KernelContext& ctx) {
  const RowView v = RowsOf(ctx.input(0));
  const int64_t C = v.cols;
  const float* y = ctx.input(0).data<float>();   // (R, C) log-probabilities
  const float* dy = ctx.input(1).data<float>();  // (R, C)
  float* dx = ctx.output(0).data<float>();       // (R, C)
  ParallelFor(ctx, v.rows, RowGrain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* yr = y + r * C;
      const float* dyr = dy + r * C;
      float* dxr = dx + r * C;
      const float sum = RowSum(dyr, C);
      for (int64_t j = 0; j < C; ++j) dxr[j] = dyr[j] - ExpF(yr[j]) * sum;
    }
  });
  return absl::OkStatus();
}

absl::Status FusedScaleMaskSoftmaxKernel(KernelContext& ctx) {
  return ScaleMaskSoftmax(ctx, &ctx.input(1), static_cast<float>(ctx.attr().Float("scale")), ctx.attr().Bool("causal"));
}

absl::Status FusedScaleCausalSoftmaxKernel(KernelContext& ctx) {
  return ScaleMaskSoftmax(ctx, nullptr, static_cast<float>(ctx.attr().Float("scale")), /*causal=*/true);
}

absl::Status LayerNormKernel(KernelContext& ctx) {
  const RowView v = RowsOf(ctx.input(0));
  const int64_t C = v.cols;
  const float eps = static_cast<float>(ctx.attr().Float("eps"));
  const float inv_c = 1.0f / static_cast<float>(C);
  const float* x = ctx.input(0).data<float>();      // (R, C)
  const float* gamma = ctx.input(1).data<float>();  // (C)
  const float* beta = ctx.input(2).data<float>();   // (C)
  float* y = ctx.output(0).data<float>();           // (R, C)
  float* mean = ctx.output(1).data<float>();        // (R)
  float* rstd = ctx.output(2).data<float>();        // (R)
  // Two-pass statistics (mean, then Σ(x - mean)²) in float: the row is in
  // cache for the second pass, and it does not cancel when |mean| >> std.
  ParallelFor(ctx, v.rows, RowGrain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      const float mu = RowSum(xr, C) * inv_c;
      const float var = LaneSum(C, [xr, mu](int64_t j) { return (xr[j] - mu) * (xr[j] - mu); }) * inv_c;
      const float rs = 1.0f / std::sqrt(var + eps);
      for (int64_t j = 0; j < C; ++j) yr[j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
      mean[r] = mu;
      rstd[r] = rs;
    }
  });
  return absl::OkStatus();
}

absl::Status LayerNormGradKernel(KernelContext& ctx) {
  const RowView v = RowsOf(ctx.input(1));
  const int64_t R = v.rows, C = v.cols;
  const float inv_c = 1.0f / static_cast<float>(C);
  const float* dy = ctx.input(0).data<float>();     // (R, C)
  const float* x = ctx.input(1).data<float>();      // (R, C)
  const float* mean = ctx.input(2).data<float>();   // (R)
  const float* rstd = ctx.input(3).data<float>();   // (R)
  const float* gamma = ctx.input(4).data<float>();  // (C)
  float* dx = ctx.output(0).data<float>();          // (R, C)
  float* dgamma = ctx.output(1).data<float>();      // (C)
  float* dbeta = ctx.output(2).data<float>();       // (C)
  // layer_norm_grad_add: dx + addend, added once dx's row is stored.
  const float* addend = ctx.num_inputs() > 5 ? ctx.input(5).data<float>() : nullptr;  // (R, C)
  const int64_t blocks = NormRowBlocks(R);
  std::vector<float> own;
  float* const partial = ScratchRows(ctx, blocks, 2 * C, own);  // (blocks, 2, C): dgamma, dbeta
  // With g = dy * gamma and xhat = (x - mean) * rstd:
  //   dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)).
  ParallelFor(ctx, blocks, BlockGrain(C), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* dgamma_part = partial + b * 2 * C;
      float* dbeta_part = dgamma_part + C;
      std::fill(dgamma_part, dgamma_part + 2 * C, 0.0f);
      const Range rows = BlockRows(R, b);
      for (int64_t r = rows.offset; r < rows.offset + rows.size; ++r) {
        const float* dyr = dy + r * C;
        const float* xr = x + r * C;
        float* dxr = dx + r * C;
        const float mu = mean[r], rs = rstd[r];
        const float mean_g = RowDot(dyr, gamma, C) * inv_c;
        const float mean_gx =
            LaneSum(C, [dyr, xr, gamma, mu](int64_t j) { return dyr[j] * gamma[j] * (xr[j] - mu); }) * rs * inv_c;
        LayerNormGradRow(dyr, xr, gamma, mu, rs, mean_g, mean_gx, dxr, dgamma_part, dbeta_part, C);
        if (addend != nullptr) {
          const float* ar = addend + r * C;
          for (int64_t j = 0; j < C; ++j) dxr[j] += ar[j];
        }
      }
    }
  });
  SumBlocks(ctx, partial, blocks, 2 * C, C, dgamma);
  SumBlocks(ctx, partial + C, blocks, 2 * C, C, dbeta);
  return absl::OkStatus();
}

absl::Status RmsNormKernel(KernelContext& ctx) {
  const RowView v = RowsOf(ctx.input(0));
  const int64_t C = v.cols;
  const float eps = static_cast<float>(ctx.attr().Float("eps"));
  const float inv_c = 1.0f / static_cast<float>(C);
  const float* x = ctx.input(0).data<float>();      // (R, C)
  const float* gamma = ctx.input(1).data<float>();  // (C)
  float* y = ctx.output(0).data<float>();           // (R, C)
  float* rstd = ctx.output(1).data<float>();        // (R)
  ParallelFor(ctx, v.rows, RowGrain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      const float rs = 1.0f / std::sqrt(RowDot(xr, xr, C) * inv_c + eps);
      for (int64_t j = 0; j < C; ++j) yr[j] = xr[j] * rs * gamma[j];
      rstd[r] = rs;
    }
  });
  return absl::OkStatus();
}

absl::Status RmsNormGradKernel(KernelContext& ctx) {
  const RowView v = RowsOf(ctx.input(1));
  const int64_t R = v.rows, C = v.cols;
  const float inv_c = 1.0f / static_cast<float>(C);
  const float* dy = ctx.input(0).data<float>();     // (R, C)
  const float* x = ctx.input(1).data<float>();      // (R, C)
  const float* rstd = ctx.input(2).data<float>();   // (R)
  const float* gamma = ctx.input(3).data<float>();  // (C)
  float* dx = ctx.output(0).data<float>();          // (R, C)
  float* dgamma = ctx.output(1).data<float>();      // (C)
  const int64_t blocks = NormRowBlocks(R);
  std::vector<float> own;
  float* const partial = ScratchRows(ctx, blocks, C, own);  // (blocks, C)
  // With g = dy * gamma and xhat = x * rstd: dx = rstd * (g - xhat * mean_j(g * xhat)).
  ParallelFor(ctx, blocks, BlockGrain(C), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* dgamma_part = partial + b * C;
      std::fill(dgamma_part, dgamma_part + C, 0.0f);
      const Range rows = BlockRows(R, b);
      for (int64_t r = rows.offset; r < rows.offset + rows.size; ++r) {
        const float* dyr = dy + r * C;
        const float* xr = x + r * C;
        float* dxr = dx + r * C;
        const float rs = rstd[r];
        const float mean_gx =
            LaneSum(C, [dyr, xr, gamma](int64_t j) { return dyr[j] * gamma[j] * xr[j]; }) * rs * inv_c;
        RmsNormGradRow(dyr, xr, gamma, rs, mean_gx, dxr, dgamma_part, C);
      }
    }
  });
  SumBlocks(ctx, partial, blocks, C, C, dgamma);
  return absl::OkStatus();
}

}  // namespace tessera::ops::cpu
