// Host side of matmul / batch_matmul on CUDA: the shapes and dtypes
// InferMeta checked, as cuBLAS's arguments (ops/cuda/matmul.cu).

#include "ops/cuda/matmul.h"

#include <limits>

#include "core/text.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

absl::Status Gemm(KernelContext& ctx, bool batched) {
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
                         ctx.input(1).raw_data(), ctx.output(0).data<float>()),
              batched ? "batch_matmul" : "matmul");
}

}  // namespace

absl::Status MatmulKernel(KernelContext& ctx) { return Gemm(ctx, false); }
absl::Status BatchMatmulKernel(KernelContext& ctx) { return Gemm(ctx, true); }

}  // namespace tessera::ops::cuda
