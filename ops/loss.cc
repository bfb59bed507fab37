// Cross-entropy ops. Kernels: ops/cpu/loss.cc.
//
// sparse_softmax_cross_entropy is the fused loss for logits whose vocabulary
// axis is whole on each device (rows may be split: data parallel).
//
// Vocabulary-parallel cross-entropy (Megatron's) is not one op but a
// composition of plain ops, so that the scheduler sees each collective:
//
//   logits (N, V) laid out S(1)                       each device: (N, V/p)
//   row_max   = reduce_max(logits, axes={1}, keepdim)  S(1) -> P(max)
//               boxed P(max) -> B                      all-reduce MAX, (N, 1)
//   sumexp, label_logit = cross_entropy_partials(logits, row_max, labels)
//                                                      (S(1), B, B) -> (P, P)
//               boxed P -> B                           all-reduce SUM, 2 x (N, 1)
//   loss      = log(sumexp) - label_logit              (N, 1), B
//
// which equals logsumexp(logits) - logits[label] for any row_max: the max is
// only a stabiliser, so row_max is a non-differentiable input (a stop
// gradient) and reduce_max never sees a gradient. Backward of the last line
// gives d_sumexp = dloss / sumexp and d_label_logit = -dloss, and
// cross_entropy_partials_grad turns them into dlogits = softmax - onehot on
// each shard without further communication: every tensor crossing devices is
// (N, 1), never (N, V).

#include <string>

#include "core/text.h"
#include "ops/cpu/loss.h"
#include "ops/op_util.h"
#include "ops/registry.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/loss.h"
#endif

namespace tessera::ops {
namespace {

absl::Status ExpectLabels(const TensorMeta& labels, int64_t N) {
  if (labels.dtype != DType::kI32 && labels.dtype != DType::kI64) {
    return absl::InvalidArgumentError(StrCat("input 'labels' must be i32 or i64, got ", DTypeName(labels.dtype)));
  }
  if (labels.shape != Shape{N}) {
    return absl::InvalidArgumentError(
        StrCat("input 'labels' must have shape (", N, ",) (one per row of logits), got ", labels.shape.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectLogits(const TensorMeta& logits) {
  RETURN_IF_ERROR(ExpectDType(logits, DType::kF32, "logits"));
  RETURN_IF_ERROR(ExpectRank(logits, 2, "logits"));
  if (logits.shape[1] == 0) {
    return absl::InvalidArgumentError(StrCat("logits have an empty vocabulary axis: ", logits.shape.ToString()));
  }
  return absl::OkStatus();
}

// f32 of shape `shape`.
absl::Status ExpectF32Shaped(const TensorMeta& meta, const Shape& shape, std::string_view name) {
  RETURN_IF_ERROR(ExpectDType(meta, DType::kF32, name));
  if (meta.shape == shape) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat("input '", name, "' must have shape ", shape.ToString(), ", got ", meta.shape.ToString()));
}

// ---- sparse_softmax_cross_entropy

absl::StatusOr<std::vector<TensorMeta>> InferSparseCrossEntropy(const std::vector<TensorMeta>& in, const AttrMap&) {
  RETURN_IF_ERROR(ExpectLogits(in[0]));
  const int64_t N = in[0].shape[0];
  RETURN_IF_ERROR(ExpectLabels(in[1], N));
  if (in.size() == 3) {
    RETURN_IF_ERROR(ExpectF32Shaped(in[2], Shape{N}, "dloss"));
    return std::vector<TensorMeta>{in[0]};
  }
  return std::vector<TensorMeta>{{DType::kF32, Shape{N}}};
}

// Rows split (data parallel) or everything broadcast; the gradient is also
// linear in dloss.
std::vector<SbpSignature> SparseCrossEntropySignatures(const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
  std::vector<SbpSignature> sigs = {
      {std::vector<Sbp>(in.size(), Sbp::Split(0)), {Sbp::Split(0)}},
      {std::vector<Sbp>(in.size(), Sbp::Broadcast()), {Sbp::Broadcast()}},
  };
  if (in.size() == 3) sigs.push_back({{Sbp::Broadcast(), Sbp::Broadcast(), Sbp::PartialSum()}, {Sbp::PartialSum()}});
  return sigs;
}

// ---- cross_entropy_partials

absl::StatusOr<std::vector<TensorMeta>> InferPartials(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(ExpectLogits(in[0]));
  const int64_t N = in[0].shape[0];
  const Shape column{N, 1};
  RETURN_IF_ERROR(ExpectF32Shaped(in[1], column, "row_max"));
  RETURN_IF_ERROR(ExpectLabels(in[2], N));
  if (in.size() == 5) {
    RETURN_IF_ERROR(ExpectF32Shaped(in[3], column, "d_sumexp"));
    RETURN_IF_ERROR(ExpectF32Shaped(in[4], column, "d_label_logit"));
    const DType dtype = attrs.GetDType("dtype");
    // (f64 goes on to the registry's refusal of f64 everywhere.)
    if (!IsFloatingPoint(dtype)) {
      return absl::InvalidArgumentError(
          StrCat("attribute 'dtype' (of dlogits) must be f32, bf16 or f16, got ", DTypeName(dtype)));
    }
    return std::vector<TensorMeta>{{dtype, in[0].shape}};
  }
  const TensorMeta out{DType::kF32, column};
  return std::vector<TensorMeta>{out, out};
}

// The vocabulary-parallel one: logits S(1) with the (N, 1) and (N) inputs
// broadcast; the kernel reads its shard's vocabulary offset from the input
// slice. Forward outputs are partial sums over shards; the gradient stays
// split like the logits. Also rows split, and all broadcast. The gradient is
// linear in (d_sumexp, d_label_logit) jointly.
std::vector<SbpSignature> PartialsSignatures(const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
  const bool grad = in.size() == 5;
  const size_t num_out = grad ? 1 : 2;
  std::vector<Sbp> vocab_split(in.size(), Sbp::Broadcast());
  vocab_split[0] = Sbp::Split(1);
  std::vector<SbpSignature> sigs = {
      {vocab_split, std::vector<Sbp>(num_out, grad ? Sbp::Split(1) : Sbp::PartialSum())},
      {std::vector<Sbp>(in.size(), Sbp::Split(0)), std::vector<Sbp>(num_out, Sbp::Split(0))},
      {std::vector<Sbp>(in.size(), Sbp::Broadcast()), std::vector<Sbp>(num_out, Sbp::Broadcast())},
  };
  if (grad) {
    sigs.push_back({{Sbp::Broadcast(), Sbp::Broadcast(), Sbp::Broadcast(), Sbp::PartialSum(), Sbp::PartialSum()},
                    {Sbp::PartialSum()}});
  }
  return sigs;
}

}  // namespace

namespace {

// On GPUs the kernels read i64 labels: i32 ones are widened into this
// workspace (8 bytes a label), planned in the arena, so no act allocates
// and frees device memory (a cudaFree waits for the whole device, NCCL's
// kernels included).
WorkspaceFn WidenedLabels(size_t labels) {
  return [labels](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const AttrMap&,
                  DeviceType device) -> int64_t {
    if (device != DeviceType::kCuda || in.size() <= labels || in[labels].dtype != DType::kI32) return 0;
    return 8 * in[labels].shape.NumElements();
  };
}

}  // namespace

void RegisterLossOps(OpRegistry& registry) {
  const TensorMeta logits{DType::kF32, Shape{4, 10}};
  const TensorMeta labels{DType::kI64, Shape{4}};
  const TensorMeta column{DType::kF32, Shape{4, 1}};

  registry.MustRegister(
      OpSchema("sparse_softmax_cross_entropy")
          .Doc("Per-row cross-entropy of softmax(logits) against class ids: loss[n] = logsumexp(logits[n]) - "
               "logits[n, labels[n]]. logits (N, V) f32, labels (N) i32/i64; an id outside [0, V) is an error "
               "naming it. Gradient: sparse_softmax_cross_entropy_grad. For logits split over the vocabulary "
               "use reduce_max + cross_entropy_partials (see ops/loss.cc).")
          .Input("logits")
          .NonDifferentiableInput("labels")
          .Output("loss")
          .Infer(InferSparseCrossEntropy)
          .Sbp(SparseCrossEntropySignatures)
          .Workspace(WidenedLabels(1))
          .Grad([](GradBuilder& b) {
            b.SetInputGrad(0,
                           b.Op("sparse_softmax_cross_entropy_grad", {b.input(0), b.input(1), b.OutputGradOrZeros(0)}));
          })
          .Kernel(DeviceType::kCpu, cpu::SparseSoftmaxCrossEntropyKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::SparseSoftmaxCrossEntropyKernel)
#endif
          .Example({logits, labels}));
  registry.MustRegister(OpSchema("sparse_softmax_cross_entropy_grad")
                            .Doc("dlogits = (softmax(logits) - onehot(labels)) * dloss[:, None].")
                            .Input("logits")
                            .Input("labels")
                            .Input("dloss")
                            .Output("dlogits")
                            .Infer(InferSparseCrossEntropy)
                            .Sbp(SparseCrossEntropySignatures)
                            .Workspace(WidenedLabels(1))
                            .Kernel(DeviceType::kCpu, cpu::SparseSoftmaxCrossEntropyGradKernel)
#ifdef TESSERA_WITH_CUDA
                            .Kernel(DeviceType::kCuda, cuda::SparseSoftmaxCrossEntropyGradKernel)
#endif
                            .Example({logits, labels, {DType::kF32, Shape{4}}}));
  registry.MustRegister(
      OpSchema("cross_entropy_partials")
          .Doc("Per-shard pieces of vocabulary-parallel cross-entropy: sumexp[n] = Σ_j exp(logits[n, j] - "
               "row_max[n]) over this shard's columns, label_logit[n] = logits[n, labels[n]] - row_max[n] if "
               "this shard holds the label's column, else 0. logits (N, V) f32 (may be split on V: "
               "S(1), B, B -> P, P), row_max (N, 1) f32 (the row's max over the whole vocabulary, from "
               "reduce_max: a stabiliser only, the loss does not depend on it), labels (N) i32/i64 global ids "
               "in [0, V). The loss is log(sumexp) - label_logit. row_max and labels get no gradient. "
               "Gradient: cross_entropy_partials_grad.")
          .Input("logits")
          .NonDifferentiableInput("row_max")
          .NonDifferentiableInput("labels")
          .Output("sumexp")
          .Output("label_logit")
          .Infer(InferPartials)
          .Sbp(PartialsSignatures)
          .Workspace(WidenedLabels(2))
          .Grad([](GradBuilder& b) {
            b.SetInputGrad(0, b.Op("cross_entropy_partials_grad", {b.input(0), b.input(1), b.input(2),
                                                                   b.OutputGradOrZeros(0), b.OutputGradOrZeros(1)}));
          })
          .Kernel(DeviceType::kCpu, cpu::CrossEntropyPartialsKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::CrossEntropyPartialsKernel)
#endif
          .Example({logits, column, labels}));
  registry.MustRegister(
      OpSchema("cross_entropy_partials_grad")
          .Doc("Backward of cross_entropy_partials for logits: dlogits = d_sumexp * exp(logits - row_max) + "
               "d_label_logit * onehot(labels), the onehot only inside this shard's vocabulary columns. dtype: "
               "dlogits' type, f32 or bf16 / f16 (the f32 values rounded to nearest even, as cast rounds them: "
               "mixed precision sets it when a cast for the head's GEMMs is dlogits' only reader)")
          .Input("logits")
          .Input("row_max")
          .Input("labels")
          .Input("d_sumexp")
          .Input("d_label_logit")
          .Output("dlogits")
          .Attr("dtype", AttrType::kDType, DType::kF32)
          .Infer(InferPartials)
          .Sbp(PartialsSignatures)
          .Workspace(WidenedLabels(2))
          .Kernel(DeviceType::kCpu, cpu::CrossEntropyPartialsGradKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::CrossEntropyPartialsGradKernel)
#endif
          .Example({logits, column, labels, column, column}));
}

}  // namespace tessera::ops
