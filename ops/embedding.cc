// Embedding lookup and its scatter-add gradient.
//
//   embedding(weight (V, C), ids (...)) -> (..., C)
//   embedding_grad(dy (..., C), ids (...); num_embeddings = V) -> dweight (V, C)
//
// Besides the usual data-parallel (split ids) and column-parallel (split C)
// layouts, both ops support Megatron's vocabulary-parallel embedding: the
// weight is split by rows, every shard looks up only the ids in its row range
// (zeros elsewhere) and the output is a partial sum; backwards, each shard keeps
// only the rows of its range. The kernels find their range in the slices.

#include "core/text.h"
#include "ops/op_util.h"
#include "ops/registry.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/embedding.h"
#endif

namespace tessera::ops {

namespace cpu {
absl::Status EmbeddingKernel(KernelContext& ctx);
absl::Status EmbeddingGradKernel(KernelContext& ctx);
// int64 words of its workspace: row starts (rows + 1), fill cursors (rows),
// the occurrences' order (ids).
int64_t EmbeddingGradWorkspaceWords(int64_t rows, int64_t ids);
}  // namespace cpu

namespace {

absl::Status ExpectIds(const TensorMeta& ids) {
  if (ids.dtype == DType::kI32 || ids.dtype == DType::kI64) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat("input 'ids' must be i32 or i64, got ", DTypeName(ids.dtype)));
}

absl::StatusOr<std::vector<TensorMeta>> InferEmbedding(const std::vector<TensorMeta>& in, const AttrMap&) {
  const TensorMeta& weight = in[0];
  const TensorMeta& ids = in[1];
  RETURN_IF_ERROR(ExpectDType(weight, DType::kF32, "weight"));
  RETURN_IF_ERROR(ExpectRank(weight, 2, "weight"));
  RETURN_IF_ERROR(ExpectIds(ids));
  std::vector<int64_t> dims = ids.shape.dims();
  dims.push_back(weight.shape[1]);
  return std::vector<TensorMeta>{{DType::kF32, Shape(std::move(dims))}};
}

std::vector<SbpSignature> EmbeddingSignatures(const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
  const int id_rank = in[1].shape.rank();
  const Sbp b = Sbp::Broadcast(), p = Sbp::PartialSum();
  std::vector<SbpSignature> sigs;
  // Data parallel: each shard looks up its own ids.
  for (int axis = 0; axis < id_rank; ++axis) sigs.push_back({{b, Sbp::Split(axis)}, {Sbp::Split(axis)}});
  // Column parallel: each shard holds some embedding channels.
  sigs.push_back({{Sbp::Split(1), b}, {Sbp::Split(id_rank)}});
  // Vocabulary parallel: each shard holds some rows and answers zeros for ids
  // outside them, so exactly one shard contributes each output row.
  sigs.push_back({{Sbp::Split(0), b}, {p}});
  // The lookup is linear in the weight.
  sigs.push_back({{p, b}, {p}});
  sigs.push_back({{b, b}, {b}});
  return sigs;
}

absl::StatusOr<std::vector<TensorMeta>> InferEmbeddingGrad(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  const TensorMeta& dy = in[0];
  const TensorMeta& ids = in[1];
  RETURN_IF_ERROR(ExpectDType(dy, DType::kF32, "dy"));
  RETURN_IF_ERROR(ExpectRank(dy, 1, "dy", /*at_least=*/true));
  RETURN_IF_ERROR(ExpectIds(ids));
  const std::vector<int64_t> lead(dy.shape.dims().begin(), dy.shape.dims().end() - 1);
  if (Shape(lead) != ids.shape) {
    return absl::InvalidArgumentError(StrCat("dy must have shape ids.shape + (C,): ids ", ids.shape.ToString(),
                                             " does not match dy ", dy.shape.ToString()));
  }
  const int64_t vocab = attrs.Int("num_embeddings");
  if (vocab < 1) return absl::InvalidArgumentError(StrCat("num_embeddings must be >= 1, got ", vocab));
  return std::vector<TensorMeta>{{DType::kF32, Shape{vocab, dy.shape[dy.shape.rank() - 1]}}};
}

std::vector<SbpSignature> EmbeddingGradSignatures(const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
  const int id_rank = in[1].shape.rank();
  const Sbp b = Sbp::Broadcast(), p = Sbp::PartialSum();
  std::vector<SbpSignature> sigs;
  // Data parallel: each shard scatters its own rows; the sum over shards is
  // the full gradient.
  for (int axis = 0; axis < id_rank; ++axis) {
    sigs.push_back({{Sbp::Split(axis), Sbp::Split(axis)}, {p}});
  }
  sigs.push_back({{Sbp::Split(id_rank), b}, {Sbp::Split(1)}});
  sigs.push_back({{b, b}, {b}});
  // Vocabulary parallel: each shard keeps only the rows it owns.
  sigs.push_back({{b, b}, {Sbp::Split(0)}});
  sigs.push_back({{p, b}, {p}});
  return sigs;
}

}  // namespace

void RegisterEmbeddingOps(OpRegistry& registry) {
  registry.MustRegister(
      OpSchema("embedding")
          .Doc("Looks up rows of weight (V, C) for integer ids (...) -> (..., C). Ids outside [0, V) are an "
               "error. Vocabulary parallel: weight S(0), ids B -> P.")
          .Input("weight")
          .NonDifferentiableInput("ids")
          .Output("y")
          .Infer(InferEmbedding)
          .Sbp(EmbeddingSignatures)
          .Grad([](GradBuilder& b) {
            const int64_t vocab = b.meta(b.input(0)).shape[0];
            b.SetInputGrad(0,
                           b.Op("embedding_grad", {b.OutputGradOrZeros(0), b.input(1)}, {{"num_embeddings", vocab}}));
          })
          .Kernel(DeviceType::kCpu, cpu::EmbeddingKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::EmbeddingKernel)
#endif
          .Example({{DType::kF32, Shape{50, 8}}, {DType::kI64, Shape{4, 6}}}));

  registry.MustRegister(
      OpSchema("embedding_grad")
          .Doc("Gradient of embedding w.r.t. its weight: scatter-adds dy (..., C) into rows ids (...) of a "
               "(num_embeddings, C) zero tensor. Deterministic (fixed summation order).")
          .Input("dy")
          .NonDifferentiableInput("ids")
          .Output("dweight")
          .Attr("num_embeddings", AttrType::kInt)
          .Infer(InferEmbeddingGrad)
          .Sbp(EmbeddingGradSignatures)
          .Workspace([](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out, const AttrMap&,
                        DeviceType device) -> int64_t {
            // The CPU kernel's counting sort of the ids by row.
            if (device != DeviceType::kCpu || out.empty() || out[0].shape.rank() < 1) return 0;
            return 8 * cpu::EmbeddingGradWorkspaceWords(out[0].shape[0], in[1].shape.NumElements());
          })
          .Kernel(DeviceType::kCpu, cpu::EmbeddingGradKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::EmbeddingGradKernel)
#endif
          .Example({{DType::kF32, Shape{4, 6, 8}}, {DType::kI64, Shape{4, 6}}}, {{"num_embeddings", int64_t{50}}}));
}

}  // namespace tessera::ops
