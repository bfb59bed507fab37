// Host side of the CUDA reductions: x's axes split into kept and reduced
// ones (with their strides), for LaunchReduce (ops/cuda/reduce.cu).

#include "ops/cuda/reduce.h"

#include "core/text.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

// x's axes split into kept and reduced ones, with their strides. With
// `merge`, axes of size 1 are left out and each run of adjacent axes of one
// kind becomes one axis (the same coordinates in the same order), so the
// kernels index with fewer divisions (a bias gradient's (B, T) is one axis).
absl::StatusOr<ReduceLayout> LayoutOf(const Shape& shape, const std::vector<bool>& reduced, bool merge = false) {
  if (shape.rank() > kMaxRank) {
    return absl::UnimplementedError(StrCat("CUDA reductions up to rank ", kMaxRank, ", got ", shape.rank()));
  }
  const std::vector<int64_t> strides = shape.Strides();
  ReduceLayout layout;
  int last = -1;  // the kind of the axis appended last: 0 kept, 1 reduced
  for (int a = 0; a < shape.rank(); ++a) {
    if (merge && shape[a] == 1) continue;
    const bool r = reduced[static_cast<size_t>(a)];
    int& rank = r ? layout.reduced_rank : layout.kept_rank;
    int64_t* dims = r ? layout.reduced_dims : layout.kept_dims;
    int64_t* axis_strides = r ? layout.reduced_strides : layout.kept_strides;
    const int64_t stride = strides[static_cast<size_t>(a)];
    if (merge && last == static_cast<int>(r) && axis_strides[rank - 1] == shape[a] * stride) {
      dims[rank - 1] *= shape[a];
      axis_strides[rank - 1] = stride;
    } else {
      dims[rank] = shape[a];
      axis_strides[rank++] = stride;
    }
    last = static_cast<int>(r);
  }
  return layout;
}

absl::Status Run(const KernelContext& ctx, int kind, const Tensor& x, const std::vector<bool>& reduced, float scale,
                 const Tensor& y) {
  RETURN_IF_ERROR(OnDevice(ctx));
  ASSIGN_OR_RETURN(const ReduceLayout layout, LayoutOf(x.shape(), reduced, /*merge=*/true));
  // reduce_sum reads bf16 and f16 too (1, 2); the rest f32 (0).
  const DType t = x.dtype();
  if (t != DType::kF32 && t != DType::kBF16 && t != DType::kF16) {
    return absl::InvalidArgumentError(StrCat("CUDA reduction of ", DTypeName(t), ": no kernel handles this dtype"));
  }
  const int x_dtype = t == DType::kBF16 ? 1 : t == DType::kF16 ? 2 : 0;
  return Done(LaunchReduce(kind, x_dtype, x.raw_data(), y.data<float>(), layout, scale, WorkspaceOf(ctx),
                           WorkspaceBytesOf(ctx)),
              "reduction");
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
