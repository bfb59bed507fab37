// Fused attention ops: y = softmax(scale · q kᵀ + masks) v in one kernel,
// never holding the (T, S) scores (kernels: ops/cpu/attention.cc, on GPUs
// ops/cuda/attention.cu), with the row log-sum-exp saved for the backward.
//   flash_attention(q, k, v) -> (y, lse)                 causal or full
//   flash_attention_masked(q, k, v, mask) -> (y, lse)    plus a key padding mask
//   flash_attention_grad(q, k, v, y, lse, dy) -> (dq, dk, dv)
//   flash_attention_masked_grad(q, k, v, y, lse, dy, mask) -> (dq, dk, dv)
// q (B, H, T, D), k and v (B, H, S, D), f32, bf16 or f16 alike; mask bool
// (B, S) (true = keep); y f32 (B, H, T, D), lse f32 (B, H, T). With
// layout = "bthd" q, y (and dy, dq) are (B, T, H, D) and k, v (dk, dv)
// (B, S, H, D): a (B·T, H·D) projection's heads read and written in place,
// with no transposes around the op; lse stays (B, H, T). 16-bit q, k,
// v are what mixed precision gives the op (graph/passes/amp.cc; products on
// tensor cores on GPUs); the gradient then takes y, lse, dy f32 and gives
// dq, dk, dv in q's type (autocast's rule, as matmul's). With causal, query
// t sees keys s <= t + S - T (the fused softmaxes' alignment); a query that
// sees no key gets y = 0 and lse = -inf. Attributes dropout_rate, seed and
// tensor_id drop probabilities exactly as the dropout op with those
// attributes drops the (B, H, T, S) probabilities tensor
// (ops/attention_shape.h): the op draws by global index like it, so the
// masks do not depend on the layout or the micro-batching, and fused and
// unfused attention agree.
//
// SBP: batch or heads split alike in q, k, v, y, lse (the mask split with
// the batch, broadcast with the heads), or the queries split along T with
// k, v whole (the causal limit follows the query block's offset); then the
// gradient's dk and dv are partial sums over query blocks. The heads and
// T axes are the layout's.

#include "ops/cpu/attention.h"

#include <cmath>
#include <string>

#include "core/text.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/attention.h"
#endif
#include "ops/op_util.h"
#include "ops/registry.h"

namespace tessera::ops {
namespace {

absl::Status ExpectShape(const TensorMeta& meta, const Shape& shape, std::string_view name, std::string_view like) {
  if (meta.shape == shape) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat("input '", name, "' must have shape ", shape.ToString(), " (", like, "), got ", meta.shape.ToString()));
}

bool Bthd(const AttrMap& attrs) { return attrs.String("layout") == "bthd"; }

// q, k, v (and the mask, when `masked`, at `mask_index`) checked; the
// forward outputs' metas.
absl::StatusOr<std::vector<TensorMeta>> InferQkv(const std::vector<TensorMeta>& in, const AttrMap& attrs, bool masked,
                                                 size_t mask_index) {
  const DType dtype = in[0].dtype;
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(StrCat("input 'q' must be f32, bf16 or f16, got ", DTypeName(dtype)));
  }
  RETURN_IF_ERROR(ExpectRank(in[0], 4, "q"));
  for (size_t i : {size_t{1}, size_t{2}}) {
    if (in[i].dtype != dtype) {
      return absl::InvalidArgumentError(StrCat("input '", i == 1 ? "k" : "v", "' must be ", DTypeName(dtype),
                                               " like q, got ", DTypeName(in[i].dtype)));
    }
  }
  RETURN_IF_ERROR(ExpectRank(in[1], 4, "k"));
  const Shape& q = in[0].shape;
  const Shape& k = in[1].shape;
  const bool bthd = Bthd(attrs);
  const int heads = bthd ? 2 : 1, rows = bthd ? 1 : 2;
  if (k[0] != q[0] || k[heads] != q[heads] || k[3] != q[3]) {
    return absl::InvalidArgumentError(StrCat("input 'k' must be ", bthd ? "(B, S, H, D)" : "(B, H, S, D)",
                                             " with q's B, H and D ", q.ToString(), ", got ", k.ToString()));
  }
  RETURN_IF_ERROR(ExpectShape(in[2], k, "v", "like k"));
  if (masked) {
    RETURN_IF_ERROR(ExpectDType(in[mask_index], DType::kBool, "mask"));
    RETURN_IF_ERROR(ExpectShape(in[mask_index], Shape{q[0], k[rows]}, "mask", "(B, S): one flag per key"));
  }
  return std::vector<TensorMeta>{{DType::kF32, q}, {DType::kF32, Shape{q[0], q[heads], q[rows]}}};
}

// The CPU kernels' scratch with 16-bit q, k, v (ops/cpu/attention.cc):
// `copies` times q, k and v in f32; none for f32 inputs.
int64_t WidenedBytes(const std::vector<TensorMeta>& in, int64_t copies) {
  if (in.size() < 3 || in[0].dtype == DType::kF32) return 0;
  return 4 * copies * (in[0].shape.NumElements() + in[1].shape.NumElements() + in[2].shape.NumElements());
}

absl::Status ExpectValidAttrs(const AttrMap& attrs) {
  const double scale = attrs.Float("scale");
  if (!std::isfinite(scale)) return absl::InvalidArgumentError(StrCat("attribute 'scale' must be finite, got ", scale));
  const double rate = attrs.Float("dropout_rate");
  if (!(rate >= 0 && rate < 1)) {
    return absl::InvalidArgumentError(StrCat("attribute 'dropout_rate' must be in [0, 1), got ", rate));
  }
  const std::string& layout = attrs.String("layout");
  if (layout != "bhtd" && layout != "bthd") {
    return absl::InvalidArgumentError(
        StrCat("attribute 'layout' must be \"bhtd\" ((B, H, T, D)) or \"bthd\" ((B, T, H, D)), got \"", layout, "\""));
  }
  return absl::OkStatus();
}

// The attributes both ops of a pair take.
void DeclareAttrs(OpSchema& schema) {
  schema.Attr("scale", AttrType::kFloat, 1.0)
      .Attr("causal", AttrType::kBool, false)
      .Attr("dropout_rate", AttrType::kFloat, 0.0)
      .Attr("seed", AttrType::kInt, int64_t{0})
      .Attr("tensor_id", AttrType::kInt, int64_t{0})
      .Attr("layout", AttrType::kString, std::string("bhtd"))
      .DrawsByGlobalIndex("dropout_rate");
}

// Signatures over inputs laid out as `roles`: 'q' (a query tensor: q, y,
// dy), 'l' (lse, (B, H, T) in either layout), 'k' (k, v), 'm' (the mask).
// Outputs as `outputs` (forward: y, lse; gradient: dq, dk, dv), 'k' there
// for dk and dv.
std::vector<SbpSignature> AttentionSignatures(const AttrMap& attrs, const std::string& roles,
                                              const std::string& outputs) {
  const bool bthd = Bthd(attrs);
  const int heads = bthd ? 2 : 1, rows = bthd ? 1 : 2;
  std::vector<SbpSignature> sigs;
  auto sig = [&](Sbp query, Sbp key, Sbp mask, Sbp stat, Sbp key_grad) {
    SbpSignature s;
    for (char r : roles) s.inputs.push_back(r == 'q' ? query : r == 'k' ? key : r == 'l' ? stat : mask);
    for (char r : outputs) s.outputs.push_back(r == 'q' ? query : r == 'l' ? stat : key_grad);
    sigs.push_back(std::move(s));
  };
  const Sbp kB = Sbp::Broadcast();
  sig(Sbp::Split(0), Sbp::Split(0), Sbp::Split(0), Sbp::Split(0), Sbp::Split(0));   // batch
  sig(Sbp::Split(heads), Sbp::Split(heads), kB, Sbp::Split(1), Sbp::Split(heads));  // heads
  // Queries along T, keys whole: each query block's dk, dv are its share.
  sig(Sbp::Split(rows), kB, kB, Sbp::Split(2), Sbp::PartialSum());
  sig(kB, kB, kB, kB, kB);
  return sigs;
}

void RegisterFlashAttention(OpRegistry& r, bool masked) {
  const std::string name = masked ? "flash_attention_masked" : "flash_attention";
  const std::string grad_name = name + "_grad";
  const Shape q{2, 4, 8, 8}, lse{2, 4, 8};
  OpSchema forward(name);
  forward
      .Doc(StrCat("Fused attention: y = softmax(scale · q kᵀ) v over the keys, for q (B, H, T, D), k and v (B, H, S, "
                  "D)",
                  masked ? ", keys dropped where the bool mask (B, S) is false" : "",
                  "; with causal, query t sees keys s <= t + S - T. layout = \"bthd\": q, y (B, T, H, D) and k, "
                  "v (B, S, H, D) instead, lse still (B, H, T). With dropout_rate > 0 the probabilities are "
                  "dropped as the dropout op (seed, tensor_id) would drop the (B, H, T, S) probabilities tensor. lse "
                  "(B, H, T) is each row's log-sum-exp of the scaled, masked scores (-inf for a query that sees no "
                  "key, whose y is 0), saved for the gradient. Never forms the (T, S) scores."))
      .Input("q")
      .Input("k")
      .Input("v");
  if (masked) forward.NonDifferentiableInput("mask");
  forward.Output("y").Output("lse");
  DeclareAttrs(forward);
  forward.Workspace([](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const AttrMap&,
                       DeviceType device) -> int64_t {
    return device == DeviceType::kCpu ? WidenedBytes(in, 1) : 0;  // the CPU's q, k, v in f32
  });
  forward
      .Infer(
          [masked](const std::vector<TensorMeta>& in, const AttrMap& attrs) -> absl::StatusOr<std::vector<TensorMeta>> {
            RETURN_IF_ERROR(ExpectValidAttrs(attrs));
            return InferQkv(in, attrs, masked, 3);
          })
      .Sbp([masked](const std::vector<TensorMeta>&, const AttrMap& attrs, int64_t) {
        return AttentionSignatures(attrs, masked ? "qkkm" : "qkk", "ql");
      })
      .Grad([grad_name, masked](GradBuilder& b) {
        // lse is a saved statistic: its gradient is not propagated (as
        // layer_norm's mean and rstd).
        std::vector<ValueId> inputs = {b.input(0),  b.input(1),  b.input(2),
                                       b.output(0), b.output(1), b.OutputGradOrZeros(0)};
        if (masked) inputs.push_back(b.input(3));
        const std::vector<ValueId> g = b.Ops(grad_name, inputs, b.attrs());
        if (g.size() != 3) return;  // emission failed; the builder holds the error
        for (int i = 0; i < 3; ++i) b.SetInputGrad(i, g[static_cast<size_t>(i)]);
      })
      .Kernel(DeviceType::kCpu, cpu::FlashAttentionKernel)
#ifdef TESSERA_WITH_CUDA
      .Kernel(DeviceType::kCuda, cuda::FlashAttentionKernel)
#endif
      ;
  std::vector<TensorMeta> example = {{DType::kF32, q}, {DType::kF32, q}, {DType::kF32, q}};
  if (masked) example.push_back({DType::kBool, Shape{2, 8}});
  // The masked examples drop too (so the CUDA kernels' masks are compared).
  AttrMap example_attrs = {{"scale", 0.35}, {"causal", !masked}};
  if (masked) {
    example_attrs.Set("dropout_rate", 0.25);
    example_attrs.Set("seed", int64_t{3});
    example_attrs.Set("tensor_id", int64_t{5});
  }
  forward.Example(example, example_attrs);
  r.MustRegister(std::move(forward));

  OpSchema backward(grad_name);
  backward
      .Doc(StrCat("Backward of ", name, ": (q, k, v, y, lse, dy", masked ? ", mask" : "",
                  ") -> (dq, dk, dv), recomputing the probabilities from lse tile by tile."))
      .Input("q")
      .Input("k")
      .Input("v")
      .Input("y")
      .Input("lse")
      .Input("dy");
  if (masked) backward.Input("mask");
  backward.Output("dq").Output("dk").Output("dv");
  DeclareAttrs(backward);
  backward.Workspace([](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const AttrMap&,
                        DeviceType device) -> int64_t {
    if (in.size() < 3 || in[0].shape.rank() != 4) return 0;
    // The CUDA kernels' Σ dy ⊙ y per query row (B·H·T floats).
    if (device == DeviceType::kCuda) return 4 * in[0].shape[0] * in[0].shape[1] * in[0].shape[2];
    return WidenedBytes(in, 2);  // the CPU's: q, k, v and dq, dk, dv in f32
  });
  backward
      .Infer(
          [masked](const std::vector<TensorMeta>& in, const AttrMap& attrs) -> absl::StatusOr<std::vector<TensorMeta>> {
            RETURN_IF_ERROR(ExpectValidAttrs(attrs));
            ASSIGN_OR_RETURN(std::vector<TensorMeta> forward, InferQkv(in, attrs, masked, 6));
            RETURN_IF_ERROR(ExpectDType(in[3], DType::kF32, "y"));
            RETURN_IF_ERROR(ExpectShape(in[3], forward[0].shape, "y", "like q"));
            RETURN_IF_ERROR(ExpectDType(in[4], DType::kF32, "lse"));
            RETURN_IF_ERROR(ExpectShape(in[4], forward[1].shape, "lse", "q without its last axis"));
            RETURN_IF_ERROR(ExpectDType(in[5], DType::kF32, "dy"));
            RETURN_IF_ERROR(ExpectShape(in[5], forward[0].shape, "dy", "like q"));
            return std::vector<TensorMeta>{in[0], in[1], in[2]};
          })
      .Sbp([masked](const std::vector<TensorMeta>&, const AttrMap& attrs, int64_t) {
        return AttentionSignatures(attrs, masked ? "qkkqlqm" : "qkkqlq", "qkk");
      })
      .Kernel(DeviceType::kCpu, cpu::FlashAttentionGradKernel)
#ifdef TESSERA_WITH_CUDA
      .Kernel(DeviceType::kCuda, cuda::FlashAttentionGradKernel)
#endif
      ;
  std::vector<TensorMeta> grad_example = {{DType::kF32, q}, {DType::kF32, q},   {DType::kF32, q},
                                          {DType::kF32, q}, {DType::kF32, lse}, {DType::kF32, q}};
  if (masked) grad_example.push_back({DType::kBool, Shape{2, 8}});
  backward.Example(grad_example, example_attrs);
  r.MustRegister(std::move(backward));
}

}  // namespace

void RegisterAttentionOps(OpRegistry& registry) {
  RegisterFlashAttention(registry, /*masked=*/false);
  RegisterFlashAttention(registry, /*masked=*/true);
}

}  // namespace tessera::ops
