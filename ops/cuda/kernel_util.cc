#include "ops/cuda/kernel_util.h"

#include "core/text.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {

absl::Status OnDevice(const KernelContext& ctx) {
  if (ctx.device.type != DeviceType::kCuda) {
    return absl::InvalidArgumentError(StrCat("a CUDA kernel called for ", ctx.device.ToString()));
  }
  for (const auto* list : {&ctx.inputs, &ctx.outputs}) {
    for (const Tensor& t : *list) {
      if (t.device() != ctx.device) {
        return absl::InvalidArgumentError(
            StrCat("a tensor on ", t.device().ToString(), " given to a kernel on ", ctx.device.ToString()));
      }
    }
  }
  const int err = SetDevice(ctx.device.index);
  if (err != 0) return absl::InternalError(StrCat("cudaSetDevice(", ctx.device.index, "): ", ErrorString(err)));
  BindStream(ctx.stream != nullptr ? ctx.stream->native() : nullptr);
  return absl::OkStatus();
}

absl::Status Done(int err, std::string_view what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(StrCat("CUDA ", what, " kernel: ", ErrorString(err)));
}

}  // namespace tessera::ops::cuda
