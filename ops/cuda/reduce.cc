// Host side of the CUDA reductions: x's axes split into kept and reduced
// ones (with their strides), for LaunchReduce (ops/cuda/reduce.cu).

#include "ops/cuda/reduce.h"

#include "core/text.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

// x's axes split into kept and reduced ones, with their strides.
absl::StatusOr<ReduceLayout> LayoutOf(const Shape& shape, const std::vector<bool>& reduced) {
  if (shape.rank() > kMaxRank) {
    return absl::UnimplementedError(StrCat("CUDA reductions up to rank ", kMaxRank, ", got ", shape.rank()));
  }
  const std::vector<int64_t> strides = shape.Strides();
  ReduceLayout layout;
  for (int a = 0; a < shape.rank(); ++a) {
    if (reduced[static_cast<size_t>(a)]) {
      layout.reduced_dims[layout.reduced_rank] = shape[a];
      layout.reduced_strides[layout.reduced_rank++] = strides[static_cast<size_t>(a)];
    } else {
      layout.kept_dims[layout.kept_rank] = shape[a];
      layout.kept_strides[layout.kept_rank++] = strides[static_cast<size_t>(a)];
    }
  }
  return layout;
}

absl::Status Run(const KernelContext& ctx, int kind, const Tensor& x, const std::vector<bool>& reduced, float scale,
                 const Tensor& y) {
  RETURN_IF_ERROR(OnDevice(ctx));
  ASSIGN_OR_RETURN(const ReduceLayout layout, LayoutOf(x.shape(), reduced));
  return Done(LaunchReduce(kind, x.data<float>(), y.data<float>(), layout, scale), "reduction");
}

}  // namespace

absl::Status Reduce(const KernelContext& ctx, cpu::ReduceKind kind, const Tensor& x, const std::vector<bool>& reduced,
                    float scale, const Tensor& y) {
  return Run(ctx, kind == cpu::ReduceKind::kMax ? 1 : 0, x, reduced, scale, y);
}

absl::Status SquareSum(const KernelContext& ctx, const Tensor& x, const Tensor& y) {
  return Run(ctx, 2, x, std::vector<bool>(static_cast<size_t>(x.shape().rank()), true), 1.0f, y);
}

absl::Status ReduceMaxGrad(const KernelContext& ctx, const Tensor& x, const std::vector<bool>& reduced, const Tensor& y,
                           const Tensor& dy, const Tensor& dx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  ASSIGN_OR_RETURN(const ReduceLayout layout, LayoutOf(x.shape(), reduced));
  return Done(LaunchReduceMaxGrad(x.data<float>(), y.data<float>(), dy.data<float>(), dx.data<float>(), layout),
              "reduce_max_grad");
}

absl::Status Argmax(const KernelContext& ctx, const Tensor& x, int axis, const Tensor& y) {
  RETURN_IF_ERROR(OnDevice(ctx));
  std::vector<bool> reduced(static_cast<size_t>(x.shape().rank()), false);
  reduced[static_cast<size_t>(axis)] = true;
  ASSIGN_OR_RETURN(const ReduceLayout layout, LayoutOf(x.shape(), reduced));
  return Done(LaunchArgmax(x.data<float>(), y.data<int64_t>(), layout), "argmax");
}

absl::Status TopK(const KernelContext& ctx, const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const int64_t n = x.shape().rank() == 0 ? 1 : x.shape()[x.shape().rank() - 1];
  const int64_t rows = n == 0 ? 0 : x.NumElements() / n;
  return Done(LaunchTopK(x.data<float>(), values.data<float>(), indices.data<int64_t>(), rows, n, k), "topk");
}

}  // namespace tessera::ops::cuda
