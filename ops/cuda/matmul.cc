// Host side of matmul / batch_matmul / matmul_add / matmul_bias / matmul_bias_gelu on CUDA: the shapes
// and dtypes InferMeta checked, as cuBLASLt's (and cuBLAS's) arguments
// (ops/cuda/matmul.cu).

#include "ops/cuda/matmul.h"

#include <limits>

#include "core/text.h"
#include "ops/cpu/elementwise.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

// matmul (addend false: y = alpha op(a) op(b)), batch_matmul, and matmul_add
// (+ input 2).
absl::Status Gemm(KernelContext& ctx, bool batched, bool addend = false) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& a = ctx.input(0);
  const Shape& as = a.shape();
  const Shape& ys = ctx.output(0).shape();
  const int r = ys.rank();
  const bool ta = ctx.attr().Bool("transpose_a"), tb = ctx.attr().Bool("transpose_b");
  const int64_t M = ys[r - 2], N = ys[r - 1], K = ta ? as[as.rank() - 2] : as[as.rank() - 1];
  const int64_t batch = batched && M * N > 0 ? ctx.output(0).NumElements() / (M * N) : (batched ? 0 : 1);
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (M > kMaxInt || N > kMaxInt || K > kMaxInt || batch > kMaxInt) {
    return absl::UnimplementedError(
        StrCat("CUDA matmul: dimensions past 2^31 (", M, " x ", N, " x ", K, ", batch ", batch, ")"));
  }
  const int dtype = a.dtype() == DType::kBF16 ? 1 : a.dtype() == DType::kF16 ? 2 : 0;
  return Done(LaunchGemm(dtype, ta, tb, batch, M, N, K, static_cast<float>(ctx.attr().Float("alpha")), a.raw_data(),
                         ctx.input(1).raw_data(), ctx.output(0).data<float>(), WorkspaceOf(ctx), WorkspaceBytesOf(ctx),
                         addend ? ctx.input(2).data<float>() : nullptr),
              batched ? "batch_matmul" : (addend ? "matmul_add" : "matmul"));
}

// matmul_bias and matmul_bias_gelu: the local x (M, K), weight (K, N) and
// bias (N) as cuBLASLt's; `name` for errors.
struct Linear {
  int64_t M, N, K;
  int dtype;
  const void *x, *w;
  const float* bias;
};

absl::StatusOr<Linear> LinearOf(KernelContext& ctx, std::string_view name) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor &x = ctx.input(0), &w = ctx.input(1);
  const int64_t M = x.shape()[0], K = x.shape()[1], N = w.shape()[1];
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (M > kMaxInt || N > kMaxInt || K > kMaxInt) {
    return absl::UnimplementedError(StrCat("CUDA ", name, ": dimensions past 2^31 (", M, " x ", N, " x ", K, ")"));
  }
  const int dtype = x.dtype() == DType::kBF16 ? 1 : x.dtype() == DType::kF16 ? 2 : 0;
  return Linear{M, N, K, dtype, x.raw_data(), w.raw_data(), ctx.input(2).data<float>()};
}

// z = x @ w + bias: cuBLASLt's BIAS epilogue, or where it has no kernel the
// GEMM and then the bias added in place.
absl::Status BiasProduct(KernelContext& ctx, const Linear& l, float* z, std::string_view name) {
  bool fused = false;
  RETURN_IF_ERROR(Done(LaunchGemmBiasLt(l.dtype, l.M, l.N, l.K, l.x, l.w, l.bias, z, nullptr, WorkspaceOf(ctx),
                                        WorkspaceBytesOf(ctx), &fused),
                       StrCat(name, " (cuBLASLt, bias epilogue)")));
  if (fused) return absl::OkStatus();
  RETURN_IF_ERROR(Done(
      LaunchGemm(l.dtype, false, false, 1, l.M, l.N, l.K, 1.0f, l.x, l.w, z, WorkspaceOf(ctx), WorkspaceBytesOf(ctx)),
      StrCat(name, " (GEMM)")));
  return Done(LaunchBiasAdd(z, l.bias, z, l.M, l.N, 0), StrCat(name, " (bias)"));
}

}  // namespace

absl::Status MatmulBiasKernel(KernelContext& ctx) {
  ASSIGN_OR_RETURN(const Linear l, LinearOf(ctx, "matmul_bias"));
  return BiasProduct(ctx, l, ctx.output(0).data<float>(), "matmul_bias");
}

absl::Status MatmulBiasGeluKernel(KernelContext& ctx) {
  ASSIGN_OR_RETURN(const Linear l, LinearOf(ctx, "matmul_bias_gelu"));
  const bool tanh_approx = ctx.attr().String("approximate") == "tanh";
  float* y = ctx.output(0).data<float>();
  float* z = ctx.output(1).data<float>();
  const cpu::UnaryKind gelu = tanh_approx ? cpu::UnaryKind::kGeluTanh : cpu::UnaryKind::kGelu;
  // bf16 / f16 inputs with the tanh GELU: all of it in cuBLASLt's epilogue
  // (its GELU's rounding differs from the CPU's formula; low-precision runs
  // are compared at rtol 2e-2 anyway). f32: the bias in the epilogue and
  // GELU by the formula the CPU uses, so f32 runs agree to rounding.
  if (tanh_approx && l.dtype != 0) {
    bool fused = false;
    RETURN_IF_ERROR(Done(LaunchGemmBiasLt(l.dtype, l.M, l.N, l.K, l.x, l.w, l.bias, z, y, WorkspaceOf(ctx),
                                          WorkspaceBytesOf(ctx), &fused),
                         "matmul_bias_gelu (cuBLASLt, GELU epilogue)"));
    if (fused) return absl::OkStatus();
  }
  RETURN_IF_ERROR(BiasProduct(ctx, l, z, "matmul_bias_gelu"));
  return Done(LaunchUnary(static_cast<int>(gelu), z, y, l.M * l.N), "matmul_bias_gelu (GELU)");
}

absl::Status MatmulKernel(KernelContext& ctx) { return Gemm(ctx, false); }
absl::Status BatchMatmulKernel(KernelContext& ctx) { return Gemm(ctx, true); }
absl::Status MatmulAddKernel(KernelContext& ctx) { return Gemm(ctx, false, /*addend=*/true); }

}  // namespace tessera::ops::cuda
