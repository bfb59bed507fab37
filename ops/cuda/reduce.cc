// Host side of the CUDA reductions: x's axes split into kept and reduced
// ones (with their strides), for LaunchReduce (ops/cuda/reduce.cu).

#include "ops/cuda/reduce.h"

#include "core/text.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

absl::Status Run(const KernelContext& ctx, int kind, const Tensor& x, const std::vector<bool>& reduced, float scale,
                 const Tensor& y) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Shape& shape = x.shape();
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

}  // namespace tessera::ops::cuda
