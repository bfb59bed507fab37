// Host side of the CUDA makers and selections (ops/cuda/shape_ops.cu): the
// value's bits from the CPU's conversion, the operands' broadcast strides.

#include "ops/cuda/select.h"

#include "core/text.h"
#include "ops/cpu/shape_ops.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

// `t`'s strides over the output's axes (aligned on the right), 0 where it
// broadcasts.
void BroadcastStrides(const Shape& t, const Shape& out, int64_t* strides) {
  const std::vector<int64_t> own = t.Strides();
  const int lead = out.rank() - t.rank();
  for (int d = 0; d < t.rank(); ++d) strides[d + lead] = t[d] == 1 ? 0 : own[static_cast<size_t>(d)];
}

absl::StatusOr<SelectLayout> LayoutOf(const Tensor& out, const Tensor& cond, const Tensor* a, const Tensor& b,
                                      const char* what) {
  const Shape& shape = out.shape();
  if (shape.rank() > kMaxRank) {
    return absl::UnimplementedError(StrCat("CUDA ", what, " broadcasts up to rank ", kMaxRank, ", got ", shape.rank()));
  }
  SelectLayout layout;
  layout.rank = shape.rank();
  layout.elem = static_cast<int>(DTypeSize(out.dtype()));
  for (int d = 0; d < shape.rank(); ++d) layout.dims[d] = shape[d];
  BroadcastStrides(cond.shape(), shape, layout.cond_strides);
  if (a != nullptr) BroadcastStrides(a->shape(), shape, layout.a_strides);
  BroadcastStrides(b.shape(), shape, layout.b_strides);
  return layout;
}

}  // namespace

absl::Status FillKernel(KernelContext& ctx, double value) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& y = ctx.output(0);
  return Done(LaunchFillBits(y.raw_data(), y.NumElements(), static_cast<int>(DTypeSize(y.dtype())),
                             cpu::ElementBits(value, y.dtype())),
              "fill");
}

absl::Status WhereKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& out = ctx.output(0);
  ASSIGN_OR_RETURN(const SelectLayout layout, LayoutOf(out, ctx.input(0), &ctx.input(1), ctx.input(2), "where"));
  return Done(LaunchSelect(static_cast<const uint8_t*>(ctx.input(0).raw_data()), ctx.input(1).raw_data(), 0,
                           ctx.input(2).raw_data(), out.raw_data(), layout),
              "where");
}

absl::Status MaskedFillKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& y = ctx.output(0);
  ASSIGN_OR_RETURN(const SelectLayout layout, LayoutOf(y, ctx.input(1), nullptr, ctx.input(0), "masked_fill"));
  return Done(LaunchSelect(static_cast<const uint8_t*>(ctx.input(1).raw_data()), nullptr,
                           cpu::ElementBits(ctx.attr().Float("value"), y.dtype()), ctx.input(0).raw_data(),
                           y.raw_data(), layout),
              "masked_fill");
}

}  // namespace tessera::ops::cuda
