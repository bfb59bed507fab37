#include "ops/cuda/cast.h"

#include "core/text.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {

int CastCode(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 3;
    case DType::kI64:
      return 4;
    case DType::kBool:
      return 5;
    case DType::kF64:
      break;
  }
  return -1;
}

absl::Status CastKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& x = ctx.input(0);
  const Tensor& y = ctx.output(0);
  if (x.dtype() == y.dtype()) {
    if (x.raw_data() == y.raw_data()) return absl::OkStatus();
    return Done(CopyOnStream(y.raw_data(), x.raw_data(), y.NumBytes()), "cast");
  }
  const int from = CastCode(x.dtype()), to = CastCode(y.dtype());
  if (from < 0 || to < 0) {
    return absl::InvalidArgumentError(
        StrCat("cast from ", DTypeName(x.dtype()), " to ", DTypeName(y.dtype()), ": no kernel handles these dtypes"));
  }
  return Done(LaunchCast(x.raw_data(), from, y.raw_data(), to, y.NumElements()), "cast");
}

absl::Status ArangeKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& y = ctx.output(0);
  const int code = CastCode(y.dtype());
  if (code < 0 || y.dtype() == DType::kBool) {
    return absl::InvalidArgumentError(StrCat("arange in ", DTypeName(y.dtype()), ": no kernel handles this dtype"));
  }
  // Under S(0) this shard holds the values from its offset on.
  return Done(LaunchArange(y.raw_data(), code, y.NumElements(), ctx.attr().Float("start"), ctx.attr().Float("step"),
                           ctx.output_slice(0).offset[0]),
              "arange");
}

}  // namespace tessera::ops::cuda
