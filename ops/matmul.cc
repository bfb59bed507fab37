// The matmul family: matmul (2-D) and batch_matmul (equal leading batch
// dimensions), both y = alpha * op(a) @ op(b) with op = optional transpose of
// the last two axes, matmul_add (matmul + an addend in its epilogue), and
// matmul_bias / matmul_bias_gelu, a Linear layer's
// GEMM with its bias (and GELU) as the GEMM's epilogue. Kernels in
// ops/cpu/matmul.cc and ops/cuda/matmul.cc.

#include "ops/cpu/matmul.h"

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/text.h"
#include "ops/op_schema.h"
#include "ops/op_util.h"
#include "ops/registry.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/matmul.h"
#endif

namespace tessera::ops {
namespace {

// Where M, K (in a) and K, N (in b) sit among the last two axes of inputs of
// rank `rank`, given the transpose flags.
struct GemmAxes {
  int a_m, a_k, b_k, b_n;
  GemmAxes(int rank, bool transpose_a, bool transpose_b) {
    const int row = rank - 2, col = rank - 1;
    a_m = transpose_a ? col : row;
    a_k = transpose_a ? row : col;
    b_k = transpose_b ? col : row;
    b_n = transpose_b ? row : col;
  }
};

// f32 x f32, or bf16 x bf16 / f16 x f16 (mixed precision: products summed
// in f32, y f32).
absl::Status ExpectGemmDTypes(const TensorMeta& a, const TensorMeta& b) {
  for (const auto& [meta, name] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
    if (meta->dtype != DType::kF32 && meta->dtype != DType::kBF16 && meta->dtype != DType::kF16) {
      return absl::InvalidArgumentError(
          StrCat("input '", name, "' must be f32, bf16 or f16, got ", DTypeName(meta->dtype)));
    }
  }
  if (a.dtype != b.dtype) {
    return absl::InvalidArgumentError(StrCat("a is ", DTypeName(a.dtype), " but b is ", DTypeName(b.dtype),
                                             "; both must have the same dtype"));
  }
  return absl::OkStatus();
}

std::string DimsToString(const std::vector<int64_t>& dims) { return Shape(dims).ToString(); }

// Shape inference shared by both ops: a, b of equal rank (2 for matmul, >= 3
// for batch_matmul) with equal leading dimensions and matching K.
absl::StatusOr<std::vector<TensorMeta>> InferGemm(const std::vector<TensorMeta>& in, const AttrMap& attrs,
                                                  bool batched) {
  const TensorMeta& a = in[0];
  const TensorMeta& b = in[1];
  RETURN_IF_ERROR(ExpectGemmDTypes(a, b));
  if (batched) {
    for (const auto& [meta, name] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
      if (meta->shape.rank() < 3) {
        return absl::InvalidArgumentError(StrCat("input '", name, "' must have rank at least 3 (..., rows, cols), got ",
                                                 meta->shape.ToString(), "; use matmul for 2-D inputs"));
      }
    }
    if (a.shape.rank() != b.shape.rank()) {
      return absl::InvalidArgumentError(StrCat("a and b must have the same rank, got ", a.shape.ToString(), " and ",
                                               b.shape.ToString(), " (batch_matmul does not broadcast)"));
    }
  } else {
    for (const auto& [meta, name] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
      if (meta->shape.rank() != 2) {
        return absl::InvalidArgumentError(
            StrCat("input '", name, "' must have rank 2, got ", meta->shape.ToString(),
                   meta->shape.rank() > 2 ? "; use batch_matmul for batched inputs" : ""));
      }
    }
  }
  const int rank = a.shape.rank();
  const std::vector<int64_t> a_batch(a.shape.dims().begin(), a.shape.dims().end() - 2);
  const std::vector<int64_t> b_batch(b.shape.dims().begin(), b.shape.dims().end() - 2);
  if (a_batch != b_batch) {
    return absl::InvalidArgumentError(StrCat("batch dimensions differ: a has ", DimsToString(a_batch), ", b has ",
                                             DimsToString(b_batch), " (batch_matmul does not broadcast)"));
  }
  const bool transpose_a = attrs.Bool("transpose_a"), transpose_b = attrs.Bool("transpose_b");
  const GemmAxes ax(rank, transpose_a, transpose_b);
  const int64_t m = a.shape[ax.a_m], k = a.shape[ax.a_k], k_b = b.shape[ax.b_k], n = b.shape[ax.b_n];
  if (k != k_b) {
    return absl::InvalidArgumentError(StrCat("contraction dimensions differ (K = ", k, " vs ", k_b, "): op(a) is (", m,
                                             ", ", k, "), op(b) is (", k_b, ", ", n, ") (transpose_a=", transpose_a,
                                             ", transpose_b=", transpose_b, ")"));
  }
  std::vector<int64_t> out = a_batch;
  out.push_back(m);
  out.push_back(n);
  return std::vector<TensorMeta>{TensorMeta{DType::kF32, Shape(std::move(out))}};
}

// Every signature holds for any parallel_num: splits of M, N or K (and batch
// axes) are balanced the same way on both sides, so shards line up.
std::vector<SbpSignature> GemmSignatures(const std::vector<TensorMeta>& in, const AttrMap& attrs, int64_t) {
  const Sbp kB = Sbp::Broadcast(), kP = Sbp::PartialSum();
  std::vector<SbpSignature> sigs;
  const int rank = in[0].shape.rank();
  if (rank >= 2 && in[1].shape.rank() == rank) {
    const GemmAxes ax(rank, attrs.Bool("transpose_a"), attrs.Bool("transpose_b"));
    for (int i = 0; i < rank - 2; ++i) sigs.push_back({{Sbp::Split(i), Sbp::Split(i)}, {Sbp::Split(i)}});
    sigs.push_back({{Sbp::Split(ax.a_m), kB}, {Sbp::Split(rank - 2)}});  // rows of y
    sigs.push_back({{kB, Sbp::Split(ax.b_n)}, {Sbp::Split(rank - 1)}});  // columns of y
    sigs.push_back({{Sbp::Split(ax.a_k), Sbp::Split(ax.b_k)}, {kP}});    // pieces of the K sum
    sigs.push_back({{kP, kB}, {kP}});                                    // linear in a
    sigs.push_back({{kB, kP}, {kP}});                                    // linear in b
  }
  sigs.push_back({{kB, kB}, {kB}});
  return sigs;
}

// y = alpha * op(A) op(B), dY the output gradient. Per transpose case
// (A, B as stored; every emitted product keeps the same alpha):
//   y = α A B:     dA = α dY Bᵀ     dB = α Aᵀ dY
//   y = α Aᵀ B:    dA = α B dYᵀ     dB = α A dY
//   y = α A Bᵀ:    dA = α dY B      dB = α dYᵀ A
//   y = α Aᵀ Bᵀ:   dA = α Bᵀ dYᵀ    dB = α dYᵀ Aᵀ
// With bf16 / f16 inputs (y f32) the products take dY cast to that dtype
// and their f32 results are cast back to it (autocast's rule: a low-
// precision op's input gradients are low precision too).
// GemmInputGrads sets inputs 0 and 1's gradients from dY (f32) for a GEMM
// `op` over them (matmul_bias_gelu's too, with its dz).
void GemmInputGrads(GradBuilder& g, std::string_view op, ValueId dy, bool ta, bool tb, double alpha) {
  const DType dtype = g.meta(g.input(0)).dtype;
  const ValueId a = g.input(0), b = g.input(1);
  if (dtype != DType::kF32) dy = g.Op("cast", {dy}, {{"dtype", dtype}});
  auto product = [&](ValueId x, ValueId w, bool tx, bool tw) {
    const ValueId y = g.Op(op, {x, w}, {{"transpose_a", tx}, {"transpose_b", tw}, {"alpha", alpha}});
    return dtype == DType::kF32 ? y : g.Op("cast", {y}, {{"dtype", dtype}});
  };
  if (!ta && !tb) {
    g.SetInputGrad(0, product(dy, b, false, true));
    g.SetInputGrad(1, product(a, dy, true, false));
  } else if (ta && !tb) {
    g.SetInputGrad(0, product(b, dy, false, true));
    g.SetInputGrad(1, product(a, dy, false, false));
  } else if (!ta && tb) {
    g.SetInputGrad(0, product(dy, b, false, false));
    g.SetInputGrad(1, product(dy, a, true, false));
  } else {
    g.SetInputGrad(0, product(b, dy, true, true));
    g.SetInputGrad(1, product(dy, a, true, true));
  }
}

void GemmGrad(GradBuilder& g, std::string_view op) {
  GemmInputGrads(g, op, g.OutputGradOrZeros(0), g.attrs().Bool("transpose_a"), g.attrs().Bool("transpose_b"),
                 g.attrs().Float("alpha"));
}

// matmul_bias and matmul_bias_gelu: x (M, K) and weight (K, N) f32, bf16 or
// f16 alike, bias (N,) f32; their outputs (M, N) f32.
absl::StatusOr<TensorMeta> InferLinear(const std::vector<TensorMeta>& in) {
  RETURN_IF_ERROR(ExpectGemmDTypes(in[0], in[1]));
  RETURN_IF_ERROR(ExpectRank(in[0], 2, "x"));
  RETURN_IF_ERROR(ExpectRank(in[1], 2, "weight"));
  RETURN_IF_ERROR(ExpectDType(in[2], DType::kF32, "bias"));
  const int64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  if (in[1].shape[0] != k) {
    return absl::InvalidArgumentError(
        StrCat("weight must have ", k, " rows to match x ", in[0].shape.ToString(), ", got ", in[1].shape.ToString()));
  }
  if (in[2].shape != Shape{n}) {
    return absl::InvalidArgumentError(StrCat("bias must have shape (", n, ",) to match the columns of weight ",
                                             in[1].shape.ToString(), ", got ", in[2].shape.ToString()));
  }
  return TensorMeta{DType::kF32, Shape{m, n}};
}

absl::StatusOr<std::vector<TensorMeta>> InferMatmulBiasGelu(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  const std::string& approximate = attrs.String("approximate");
  if (approximate != "none" && approximate != "tanh") {
    return absl::InvalidArgumentError(
        StrCat("attribute 'approximate' must be \"none\" or \"tanh\", got \"", approximate, "\""));
  }
  ASSIGN_OR_RETURN(const TensorMeta out, InferLinear(in));
  return std::vector<TensorMeta>{out, out};
}

// matmul_bias: matmul's signatures with the bias laid out as y's columns:
// rows split (bias whole), columns split (bias split with them), and the
// partial sums (K split, or x or weight partial) with a partial bias, whose
// pieces sum to it as y's do.
std::vector<SbpSignature> MatmulBiasSignatures(const std::vector<TensorMeta>&, const AttrMap&, int64_t) {
  const Sbp kB = Sbp::Broadcast(), kP = Sbp::PartialSum();
  return {{{Sbp::Split(0), kB, kB}, {Sbp::Split(0)}},
          {{kB, Sbp::Split(1), Sbp::Split(0)}, {Sbp::Split(1)}},
          {{Sbp::Split(1), Sbp::Split(0), kP}, {kP}},
          {{kP, kB, kP}, {kP}},
          {{kB, kP, kP}, {kP}},
          {{kB, kB, kB}, {kB}}};
}

// The GEMM's gradients (GemmInputGrads, so mixed precision casts as
// matmul's do) and the bias's as dy summed over rows.
void MatmulBiasGrad(GradBuilder& g) {
  const ValueId dy = g.OutputGradOrZeros(0);
  g.SetInputGrad(2, g.SumToShape(dy, g.meta(g.input(2)).shape));
  GemmInputGrads(g, "matmul", dy, false, false, 1.0);
}

// Rows split, columns split with the bias, or all whole; never a partial
// sum (GELU is not linear) nor a split of K.
std::vector<SbpSignature> MatmulBiasGeluSignatures(const std::vector<TensorMeta>&, const AttrMap&, int64_t) {
  const Sbp kB = Sbp::Broadcast();
  return {{{Sbp::Split(0), kB, kB}, {Sbp::Split(0), Sbp::Split(0)}},
          {{kB, Sbp::Split(1), Sbp::Split(0)}, {Sbp::Split(1), Sbp::Split(1)}},
          {{kB, kB, kB}, {kB, kB}}};
}

// dz = dy ⊙ gelu'(z) (+ z's own gradient), then the GEMM's gradients from dz
// (GemmInputGrads, so mixed precision casts as matmul's do) and the bias's
// as dz summed over rows.
void MatmulBiasGeluGrad(GradBuilder& g) {
  ValueId dz =
      g.Op("gelu_grad", {g.output(1), g.OutputGradOrZeros(0)}, {{"approximate", g.attrs().String("approximate")}});
  if (g.has_output_grad(1)) dz = g.Op("add", {dz, g.output_grad(1)});
  g.SetInputGrad(2, g.SumToShape(dz, g.meta(g.input(2)).shape));
  GemmInputGrads(g, "matmul", dz, false, false, 1.0);
}

// matmul_add: matmul's signatures with c laid out as y (a partial y takes
// a partial c, whose pieces sum to it as y's do).
std::vector<SbpSignature> MatmulAddSignatures(const std::vector<TensorMeta>& in, const AttrMap& attrs, int64_t p) {
  std::vector<SbpSignature> sigs = GemmSignatures(in, attrs, p);
  for (SbpSignature& sig : sigs) sig.inputs.push_back(sig.outputs[0]);
  return sigs;
}

OpSchema& GemmAttrs(OpSchema& schema) {
  return schema.Attr("transpose_a", AttrType::kBool, false)
      .Attr("transpose_b", AttrType::kBool, false)
      .Attr("alpha", AttrType::kFloat, 1.0);
}

}  // namespace

// cuBLASLt's workspace on GPUs (a cuBLASLt call gets what it is given),
// 256 bytes more to align it; on CPUs the inputs widened to f32 where the
// CPU has no native product of their type (cpu::GemmWideningBytes: f16,
// bf16 without AVX512-BF16), none otherwise. matmul_bias_gelu (one per
// layer) takes the 32 MiB the cuBLAS documentation recommends for a Hopper
// handle; matmul, matmul_bias and batch_matmul, several of which are in
// flight at once
// (each act holds its own from launch to completion), the 4 MiB it
// recommends for earlier GPUs: 32 MiB each added 468 MiB (4.3 %) to GPT-2
// 124M's planned arena at micro-batch 8.
WorkspaceFn GemmWorkspace(int64_t mib) {
  return [mib](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const AttrMap&,
               DeviceType device) -> int64_t {
    if (device == DeviceType::kCuda) return (mib << 20) + 256;
    return in.size() >= 2 ? cpu::GemmWideningBytes(in[0], in[1]) : 0;
  };
}

void RegisterMatmulOps(OpRegistry& registry) {
  OpSchema matmul("matmul");
  matmul
      .Doc(
          "y = alpha * op(a) @ op(b) for 2-D a, b; op transposes when transpose_a / transpose_b. a and b both f32, "
          "bf16 or f16; y is f32 (low-precision products are summed in f32: oneDNN's bf16 GEMM where the CPU has "
          "AVX512-BF16, else the inputs widened to f32)")
      .Input("a")
      .Input("b")
      .Output("y");
  GemmAttrs(matmul)
      .Infer([](const std::vector<TensorMeta>& in, const AttrMap& attrs) { return InferGemm(in, attrs, false); })
      .Sbp(GemmSignatures)
      .Grad([](GradBuilder& g) { GemmGrad(g, "matmul"); })
      .Workspace(GemmWorkspace(4))
      .Kernel(DeviceType::kCpu, cpu::MatmulKernel)
#ifdef TESSERA_WITH_CUDA
      .Kernel(DeviceType::kCuda, cuda::MatmulKernel)
#endif
      .Example({{DType::kF32, Shape{4, 8}}, {DType::kF32, Shape{8, 16}}});
  registry.MustRegister(std::move(matmul));

  OpSchema batch_matmul("batch_matmul");
  batch_matmul
      .Doc(
          "y[..., :, :] = alpha * op(a[..., :, :]) @ op(b[..., :, :]) for a, b of rank >= 3 with equal leading "
          "(batch) dimensions, no broadcasting; op transposes the last two axes when transpose_a / transpose_b. "
          "a and b both f32, bf16 or f16; y is f32 (as matmul)")
      .Input("a")
      .Input("b")
      .Output("y");
  GemmAttrs(batch_matmul)
      .Infer([](const std::vector<TensorMeta>& in, const AttrMap& attrs) { return InferGemm(in, attrs, true); })
      .Sbp(GemmSignatures)
      .Grad([](GradBuilder& g) { GemmGrad(g, "batch_matmul"); })
      .Workspace(GemmWorkspace(4))
      .Kernel(DeviceType::kCpu, cpu::BatchMatmulKernel)
#ifdef TESSERA_WITH_CUDA
      .Kernel(DeviceType::kCuda, cuda::BatchMatmulKernel)
#endif
      .Example({{DType::kF32, Shape{2, 4, 8}}, {DType::kF32, Shape{2, 8, 16}}});
  registry.MustRegister(std::move(batch_matmul));

  OpSchema matmul_add("matmul_add");
  matmul_add
      .Doc(
          "y = alpha * op(a) @ op(b) + c: matmul (a, b and their attributes as matmul's) with c (f32, y's shape) "
          "added in the GEMM's epilogue (cuBLASLt's C on CUDA), the bits of matmul then add. What the engine makes "
          "of a gradient's sum with a GEMM's output (q, k and v's input gradients)")
      .Input("a")
      .Input("b")
      .Input("c")
      .Output("y");
  GemmAttrs(matmul_add)
      .Infer([](const std::vector<TensorMeta>& in, const AttrMap& attrs) -> absl::StatusOr<std::vector<TensorMeta>> {
        ASSIGN_OR_RETURN(std::vector<TensorMeta> out, InferGemm({in[0], in[1]}, attrs, false));
        if (in[2] != out[0]) {
          return absl::InvalidArgumentError(
              StrCat("c must be ", out[0].ToString(), " (the product's), got ", in[2].ToString()));
        }
        return out;
      })
      .Sbp(MatmulAddSignatures)
      .Grad([](GradBuilder& g) {
        GemmGrad(g, "matmul");
        g.SetInputGrad(2, g.OutputGradOrZeros(0));
      })
      .Workspace(GemmWorkspace(4))
      .Kernel(DeviceType::kCpu, cpu::MatmulAddKernel)
#ifdef TESSERA_WITH_CUDA
      .Kernel(DeviceType::kCuda, cuda::MatmulAddKernel)
#endif
      .Example({{DType::kF32, Shape{4, 8}}, {DType::kF32, Shape{8, 16}}, {DType::kF32, Shape{4, 16}}});
  registry.MustRegister(std::move(matmul_add));

  OpSchema linear("matmul_bias");
  linear
      .Doc(
          "y = x @ weight + bias: a Linear layer's GEMM with its bias as the GEMM's epilogue (cuBLASLt's BIAS on "
          "CUDA), the bits of matmul then bias_add. x (M, K) and weight (K, N) both f32, bf16 or f16, bias (N,) "
          "f32; y f32")
      .Input("x")
      .Input("weight")
      .Input("bias")
      .Output("y")
      .Infer([](const std::vector<TensorMeta>& in, const AttrMap&) -> absl::StatusOr<std::vector<TensorMeta>> {
        ASSIGN_OR_RETURN(const TensorMeta out, InferLinear(in));
        return std::vector<TensorMeta>{out};
      })
      .Sbp(MatmulBiasSignatures)
      .Grad(MatmulBiasGrad)
      .Workspace(GemmWorkspace(4))
      .Kernel(DeviceType::kCpu, cpu::MatmulBiasKernel)
#ifdef TESSERA_WITH_CUDA
      .Kernel(DeviceType::kCuda, cuda::MatmulBiasKernel)
#endif
      .Example({{DType::kF32, Shape{4, 8}}, {DType::kF32, Shape{8, 6}}, {DType::kF32, Shape{6}}});
  registry.MustRegister(std::move(linear));

  OpSchema fused("matmul_bias_gelu");
  fused
      .Doc(
          "z = x @ weight + bias, y = GELU(z) (approximate = \"none\": erf, or \"tanh\"): a Linear layer and its "
          "activation as one GEMM with an epilogue (cuBLASLt's GELU_AUX_BIAS on CUDA); z is kept for the gradient. "
          "x (M, K) and weight (K, N) both f32, bf16 or f16, bias (N,) f32; y and z f32")
      .Input("x")
      .Input("weight")
      .Input("bias")
      .Output("y")
      .Output("z")
      .Attr("approximate", AttrType::kString, std::string("none"))
      .Infer(InferMatmulBiasGelu)
      .Sbp(MatmulBiasGeluSignatures)
      .Grad(MatmulBiasGeluGrad)
      .Workspace(GemmWorkspace(32))
      .Kernel(DeviceType::kCpu, cpu::MatmulBiasGeluKernel)
#ifdef TESSERA_WITH_CUDA
      .Kernel(DeviceType::kCuda, cuda::MatmulBiasGeluKernel)
#endif
      .Example({{DType::kF32, Shape{4, 8}}, {DType::kF32, Shape{8, 6}}, {DType::kF32, Shape{6}}});
  registry.MustRegister(std::move(fused));
}

}  // namespace tessera::ops
