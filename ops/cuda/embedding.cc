// Host side of the CUDA embedding kernels (ops/cuda/embedding.cu): the
// shard's rows from the slices, and the CPU's error for a bad id.

#include "ops/cuda/embedding.h"

#include "core/text.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

// The CPU kernels' error for the id at position `bad` (read back from the GPU).
absl::Status BadId(const Tensor& ids, int64_t bad, int64_t vocab) {
  int64_t id = 0;
  if (ids.dtype() == DType::kI32) {
    int32_t v = 0;
    RETURN_IF_ERROR(Done(Copy(&v, static_cast<const int32_t*>(ids.raw_data()) + bad, sizeof(v)), "id read"));
    id = v;
  } else {
    RETURN_IF_ERROR(Done(Copy(&id, static_cast<const int64_t*>(ids.raw_data()) + bad, sizeof(id)), "id read"));
  }
  return absl::InvalidArgumentError(
      StrCat("id ", id, " at position ", bad, " is outside the vocabulary [0, ", vocab, ")"));
}

}  // namespace

absl::Status EmbeddingKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const TensorSlice weight_slice = ctx.input_slice(0);
  const Tensor& ids = ctx.input(1);
  const int64_t vocab = weight_slice.logical[0];
  int64_t bad = -1;
  RETURN_IF_ERROR(Done(LaunchEmbedding(ctx.input(0).data<float>(), ids.raw_data(), ids.dtype() == DType::kI32 ? 4 : 8,
                                       ctx.output(0).data<float>(), ids.NumElements(), ctx.input(0).shape()[0],
                                       ctx.input(0).shape()[1], weight_slice.offset[0], vocab, &bad),
                       "embedding"));
  return bad >= 0 ? BadId(ids, bad, vocab) : absl::OkStatus();
}

absl::Status EmbeddingGradKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const TensorSlice out_slice = ctx.output_slice(0);
  const Tensor& ids = ctx.input(1);
  const int64_t vocab = ctx.attr().Int("num_embeddings");
  int64_t bad = -1;
  RETURN_IF_ERROR(
      Done(LaunchEmbeddingGrad(ctx.input(0).data<float>(), ids.raw_data(), ids.dtype() == DType::kI32 ? 4 : 8,
                               ctx.output(0).data<float>(), ids.NumElements(), ctx.output(0).shape()[0],
                               ctx.output(0).shape()[1], out_slice.offset[0], vocab, &bad),
           "embedding_grad"));
  return bad >= 0 ? BadId(ids, bad, vocab) : absl::OkStatus();
}

}  // namespace tessera::ops::cuda
