#include "ops/cpu/loss.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/text.h"
#include "ops/cpu/cpu_util.h"
#include "ops/cpu/norm_softmax.h"
#include "ops/cpu/vec_math.h"

namespace tessera::ops::cpu {
namespace {

// Shape letters: N rows (tokens), V the logical vocabulary, Vs the vocabulary
// columns this shard holds (V when the vocabulary is not split).

// The shard's place in the logical vocabulary: its first column's global id
// and the logical V (the whole tensor when not split).
struct VocabRange {
  int64_t offset = 0;
  int64_t logical = 0;
};

VocabRange VocabOf(const KernelContext& ctx) {
  const TensorSlice slice = ctx.input_slice(0);
  return {slice.offset[1], slice.logical[1]};
}

}  // namespace

// Checked up front, serially (N is small next to N * V), so a bad id is an
// error before any output is written.
absl::StatusOr<std::vector<int64_t>> ReadLabels(const Tensor& labels, int64_t V) {
  const int64_t N = labels.NumElements();
  std::vector<int64_t> out(static_cast<size_t>(N));
  if (labels.dtype() == DType::kI32) {
    const int32_t* p = labels.data<int32_t>();
    for (int64_t n = 0; n < N; ++n) out[static_cast<size_t>(n)] = p[n];
  } else {
    const int64_t* p = labels.data<int64_t>();
    for (int64_t n = 0; n < N; ++n) out[static_cast<size_t>(n)] = p[n];
  }
  for (int64_t n = 0; n < N; ++n) {
    const int64_t label = out[static_cast<size_t>(n)];
    if (label < 0 || label >= V) {
      return absl::InvalidArgumentError(StrCat("label ", label, " (row ", n, ") is out of range for a vocabulary of ",
                                               V, ": must be in [0, ", V, ")"));
    }
  }
  return out;
}

absl::Status SparseSoftmaxCrossEntropyKernel(KernelContext& ctx) {
  const Tensor& logits_tensor = ctx.input(0);
  const int64_t N = logits_tensor.shape()[0], V = logits_tensor.shape()[1];
  ASSIGN_OR_RETURN(const std::vector<int64_t> labels, ReadLabels(ctx.input(1), V));
  const float* logits = logits_tensor.data<float>();  // (N, V)
  float* loss = ctx.output(0).data<float>();          // (N)
  // loss = logsumexp(x) - x[label], with the max subtracted before exp
  // (and from x[label]: m + log Σ, rounded first, would lose the low bits
  // of the sum's log when m is large).
  ParallelFor(ctx, N, RowGrain(V), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = logits + n * V;
      const float m = RowMax(xr, V);
      loss[n] = LogF(RowSumExp(xr, m, V)) - (xr[labels[static_cast<size_t>(n)]] - m);
    }
  });
  return absl::OkStatus();
}

absl::Status SparseSoftmaxCrossEntropyGradKernel(KernelContext& ctx) {
  const Tensor& logits_tensor = ctx.input(0);
  const int64_t N = logits_tensor.shape()[0], V = logits_tensor.shape()[1];
  ASSIGN_OR_RETURN(const std::vector<int64_t> labels, ReadLabels(ctx.input(1), V));
  const float* logits = logits_tensor.data<float>();  // (N, V)
  const float* dloss = ctx.input(2).data<float>();    // (N)
  float* dlogits = ctx.output(0).data<float>();       // (N, V)
  // dlogits = (softmax(x) - onehot(label)) * dloss.
  ParallelFor(ctx, N, RowGrain(V), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = logits + n * V;
      float* dr = dlogits + n * V;
      const float m = RowMax(xr, V);
      for (int64_t j = 0; j < V; ++j) dr[j] = ExpF(xr[j] - m);
      const float scale = dloss[n] / RowSum(dr, V);
      for (int64_t j = 0; j < V; ++j) dr[j] *= scale;
      dr[labels[static_cast<size_t>(n)]] -= dloss[n];
    }
  });
  return absl::OkStatus();
}

absl::Status CrossEntropyPartialsKernel(KernelContext& ctx) {
  const Tensor& logits_tensor = ctx.input(0);
  const int64_t N = logits_tensor.shape()[0], Vs = logits_tensor.shape()[1];
  const VocabRange vocab = VocabOf(ctx);
  ASSIGN_OR_RETURN(const std::vector<int64_t> labels, ReadLabels(ctx.input(2), vocab.logical));
  const float* logits = logits_tensor.data<float>();  // (N, Vs)
  const float* row_max = ctx.input(1).data<float>();  // (N, 1)
  float* sumexp = ctx.output(0).data<float>();        // (N, 1)
  float* label_logit = ctx.output(1).data<float>();   // (N, 1)
  ParallelFor(ctx, N, RowGrain(Vs), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = logits + n * Vs;
      const float m = row_max[n];
      sumexp[n] = RowSumExp(xr, m, Vs);
      // Only the shard holding the label's column contributes it; the others
      // give 0, so the partial sum over shards is the label's logit.
      const int64_t local = labels[static_cast<size_t>(n)] - vocab.offset;
      label_logit[n] = local >= 0 && local < Vs ? xr[local] - m : 0.0f;
    }
  });
  return absl::OkStatus();
}

absl::Status CrossEntropyPartialsGradKernel(KernelContext& ctx) {
  const Tensor& logits_tensor = ctx.input(0);
  const int64_t N = logits_tensor.shape()[0], Vs = logits_tensor.shape()[1];
  const VocabRange vocab = VocabOf(ctx);
  ASSIGN_OR_RETURN(const std::vector<int64_t> labels, ReadLabels(ctx.input(2), vocab.logical));
  const float* logits = logits_tensor.data<float>();        // (N, Vs)
  const float* row_max = ctx.input(1).data<float>();        // (N, 1)
  const float* d_sumexp = ctx.input(3).data<float>();       // (N, 1)
  const float* d_label_logit = ctx.input(4).data<float>();  // (N, 1)
  const Tensor& out = ctx.output(0);                        // (N, Vs)
  const DType dtype = out.dtype();
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(StrCat("dlogits must be f32, bf16 or f16, got ", DTypeName(dtype)));
  }
  // dlogits = d_sumexp * exp(x - row_max) + d_label_logit * onehot(label),
  // in f32; a 16-bit dlogits gets each row rounded as cast rounds it.
  ParallelFor(ctx, N, RowGrain(Vs), [&](int64_t n0, int64_t n1) {
    std::vector<float> row(dtype == DType::kF32 ? 0 : static_cast<size_t>(Vs));
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = logits + n * Vs;
      float* dr = dtype == DType::kF32 ? out.data<float>() + n * Vs : row.data();
      const float m = row_max[n], ds = d_sumexp[n];
      for (int64_t j = 0; j < Vs; ++j) dr[j] = ds * ExpF(xr[j] - m);
      const int64_t local = labels[static_cast<size_t>(n)] - vocab.offset;
      if (local >= 0 && local < Vs) dr[local] += d_label_logit[n];
      if (dtype == DType::kF32) continue;
      auto* bits = static_cast<uint16_t*>(out.raw_data()) + n * Vs;
      if (dtype == DType::kBF16) {
        for (int64_t j = 0; j < Vs; ++j) bits[j] = FloatToBFloat16(dr[j]);
      } else {
        for (int64_t j = 0; j < Vs; ++j) bits[j] = FloatToHalf(dr[j]);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace tessera::ops::cpu
