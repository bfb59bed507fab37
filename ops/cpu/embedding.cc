// CPU kernels of embedding and embedding_grad.
//
// Shape letters: V vocabulary rows held by this shard (V_logical in the whole
// weight), C channels held by this shard, N ids held by this shard.

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/text.h"
#include "ops/cpu/cpu_util.h"

namespace tessera::ops::cpu {

// int64 words of embedding_grad's workspace (ops/embedding.cc).
int64_t EmbeddingGradWorkspaceWords(int64_t rows, int64_t ids);
namespace {

// Every id must name a row of the logical weight, whichever rows this shard
// holds: an id no shard owns would silently give a zero embedding.
template <typename Id>
absl::Status CheckIds(const Id* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(StrCat("id ", static_cast<int64_t>(ids[i]), " at position ", i,
                                               " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

template <typename Id>
absl::Status Embedding(KernelContext& ctx) {
  const TensorSlice weight_slice = ctx.input_slice(0);
  const int64_t vocab_logical = weight_slice.logical[0];
  // This shard's rows [row_begin, row_begin + V) of the logical weight.
  const int64_t row_begin = weight_slice.offset[0];
  const int64_t V = ctx.input(0).shape()[0];
  const int64_t C = ctx.input(0).shape()[1];
  const int64_t N = ctx.input(1).NumElements();
  const float* weight = ctx.input(0).data<float>();  // (V, C)
  const Id* ids = ctx.input(1).data<Id>();           // (N)
  float* y = ctx.output(0).data<float>();            // (N, C)
  RETURN_IF_ERROR(CheckIds(ids, N, vocab_logical));
  ParallelFor(ctx, N, RowGrain(C), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t row = static_cast<int64_t>(ids[n]) - row_begin;
      float* out = y + n * C;
      if (row >= 0 && row < V) {
        std::memcpy(out, weight + row * C, static_cast<size_t>(C) * sizeof(float));
      } else {
        std::fill(out, out + C, 0.0f);
      }
    }
  });
  return absl::OkStatus();
}

// Scatter-add without atomics: ids are bucketed by row (a stable counting
// sort), then rows are summed in parallel, each row by one thread adding its
// occurrences in id order. The result is bitwise the same for any thread
// count, and each thread writes only rows it owns.
template <typename Id>
absl::Status EmbeddingGrad(KernelContext& ctx) {
  const int64_t vocab = ctx.attr().Int("num_embeddings");
  const TensorSlice out_slice = ctx.output_slice(0);
  const int64_t row_begin = out_slice.offset[0];  // vocabulary parallel: only rows [row_begin, row_begin + V)
  const int64_t V = ctx.output(0).shape()[0];
  const int64_t C = ctx.output(0).shape()[1];
  const int64_t N = ctx.input(1).NumElements();
  const float* dy = ctx.input(0).data<float>();  // (N, C)
  const Id* ids = ctx.input(1).data<Id>();       // (N)
  float* dweight = ctx.output(0).data<float>();  // (V, C)
  RETURN_IF_ERROR(CheckIds(ids, N, vocab));

  // Row r's occurrences are order[first[r] .. first[r + 1]); next[r] is
  // row r's fill cursor. In the workspace when the runtime gave one
  // (EmbeddingGradWorkspaceWords), else allocated here.
  std::vector<int64_t> own;
  int64_t* first = nullptr;
  const int64_t words = EmbeddingGradWorkspaceWords(V, N);
  if (ctx.workspace.defined() && static_cast<int64_t>(ctx.workspace.NumBytes()) >= words * 8) {
    first = static_cast<int64_t*>(ctx.workspace.raw_data());
  } else {
    own.resize(static_cast<size_t>(words));
    first = own.data();
  }
  int64_t* next = first + V + 1;  // (V)
  int64_t* order = next + V;      // (up to N: the occurrences held here)
  std::fill(first, first + V + 1, int64_t{0});
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = static_cast<int64_t>(ids[n]) - row_begin;
    if (row >= 0 && row < V) ++first[row + 1];
  }
  for (int64_t r = 0; r < V; ++r) first[r + 1] += first[r];
  std::copy(first, first + V, next);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = static_cast<int64_t>(ids[n]) - row_begin;
    if (row >= 0 && row < V) order[next[row]++] = n;
  }

  ParallelFor(ctx, V, RowGrain(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* out = dweight + r * C;
      std::fill(out, out + C, 0.0f);
      for (int64_t k = first[r]; k < first[r + 1]; ++k) {
        const float* src = dy + order[k] * C;
        for (int64_t c = 0; c < C; ++c) out[c] += src[c];
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

int64_t EmbeddingGradWorkspaceWords(int64_t rows, int64_t ids) { return 2 * rows + 1 + ids; }

absl::Status EmbeddingKernel(KernelContext& ctx) {
  return ctx.input(1).dtype() == DType::kI32 ? Embedding<int32_t>(ctx) : Embedding<int64_t>(ctx);
}

absl::Status EmbeddingGradKernel(KernelContext& ctx) {
  return ctx.input(1).dtype() == DType::kI32 ? EmbeddingGrad<int32_t>(ctx) : EmbeddingGrad<int64_t>(ctx);
}

}  // namespace tessera::ops::cpu
