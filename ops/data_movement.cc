#include "ops/data_movement.h"

#include "core/text.h"
#include "ops/cpu/shape_ops.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"
#endif

namespace tessera::ops::movement {
namespace {

bool OnCpu(const KernelContext& ctx) { return ctx.device.type == DeviceType::kCpu; }

#ifdef TESSERA_WITH_CUDA
// A strided copy over `dims` on the GPU, src and dst offsets in elements.
absl::Status Strided(const KernelContext& ctx, const Tensor& src, const Tensor& dst, const std::vector<int64_t>& dims,
                     const std::vector<int64_t>& src_strides, int64_t src_base, const std::vector<int64_t>& dst_strides,
                     int64_t dst_base) {
  RETURN_IF_ERROR(cuda::OnDevice(ctx));
  if (dims.size() > static_cast<size_t>(cuda::kMaxRank)) {
    return absl::UnimplementedError(StrCat("CUDA data movement up to rank ", cuda::kMaxRank, ", got ", dims.size()));
  }
  cuda::StridedCopy copy;
  copy.rank = static_cast<int>(dims.size());
  copy.elem = static_cast<int>(DTypeSize(src.dtype()));
  for (size_t a = 0; a < dims.size(); ++a) {
    copy.dims[a] = dims[a];
    copy.src_strides[a] = src_strides[a];
    copy.dst_strides[a] = dst_strides[a];
  }
  copy.src_base = src_base;
  copy.dst_base = dst_base;
  return cuda::Done(cuda::LaunchStridedCopy(src.raw_data(), dst.raw_data(), copy), "strided copy");
}
#endif

#ifndef TESSERA_WITH_CUDA
absl::Status NoKernels(const KernelContext& ctx) {
  return absl::UnimplementedError(StrCat("no data movement kernels for ", ctx.device.ToString()));
}
#endif

}  // namespace

absl::Status CopyElements(const KernelContext& ctx, const Tensor& x, const Tensor& y) {
  if (OnCpu(ctx)) {
    cpu::CopyElements(ctx, x, y);
    return absl::OkStatus();
  }
#ifdef TESSERA_WITH_CUDA
  RETURN_IF_ERROR(cuda::OnDevice(ctx));
  if (x.raw_data() == y.raw_data()) return absl::OkStatus();
  return cuda::Done(cuda::CopyOnStream(y.raw_data(), x.raw_data(), y.NumBytes()), "copy");
#else
  return NoKernels(ctx);
#endif
}

absl::Status ZeroFill(const KernelContext& ctx, const Tensor& y) {
  if (OnCpu(ctx)) {
    cpu::ZeroFill(ctx, y);
    return absl::OkStatus();
  }
#ifdef TESSERA_WITH_CUDA
  RETURN_IF_ERROR(cuda::OnDevice(ctx));
  return cuda::Done(cuda::Zero(y.raw_data(), y.NumBytes()), "zero fill");
#else
  return NoKernels(ctx);
#endif
}

absl::Status BroadcastTo(const KernelContext& ctx, const Tensor& x, const Tensor& y) {
  if (OnCpu(ctx)) {
    cpu::BroadcastTo(ctx, x, y);
    return absl::OkStatus();
  }
#ifdef TESSERA_WITH_CUDA
  const Shape& out = y.shape();
  const std::vector<int64_t> own = x.shape().Strides();
  std::vector<int64_t> src(static_cast<size_t>(out.rank()), 0);
  const int lead = out.rank() - x.shape().rank();
  for (int a = 0; a < x.shape().rank(); ++a) {
    if (x.shape()[a] != 1) src[static_cast<size_t>(a + lead)] = own[static_cast<size_t>(a)];
  }
  return Strided(ctx, x, y, out.dims(), src, 0, out.Strides(), 0);
#else
  return NoKernels(ctx);
#endif
}

absl::Status Transpose(const KernelContext& ctx, const Tensor& x, const std::vector<int>& perm, const Tensor& y) {
  if (OnCpu(ctx)) {
    cpu::Transpose(ctx, x, perm, y);
    return absl::OkStatus();
  }
#ifdef TESSERA_WITH_CUDA
  const std::vector<int64_t> own = x.shape().Strides();
  std::vector<int64_t> src;
  for (int axis : perm) src.push_back(own[static_cast<size_t>(axis)]);
  return Strided(ctx, x, y, y.shape().dims(), src, 0, y.shape().Strides(), 0);
#else
  return NoKernels(ctx);
#endif
}

absl::Status CopyBlock(const KernelContext& ctx, const Tensor& src, const std::vector<int64_t>& src_start,
                       const Tensor& dst, const std::vector<int64_t>& dst_start, const Shape& extent) {
  if (OnCpu(ctx)) {
    cpu::CopyBlockParallel(ctx, src, src_start, dst, dst_start, extent);
    return absl::OkStatus();
  }
#ifdef TESSERA_WITH_CUDA
  const std::vector<int64_t> src_strides = src.shape().Strides(), dst_strides = dst.shape().Strides();
  int64_t src_base = 0, dst_base = 0;
  for (size_t a = 0; a < src_start.size(); ++a) {
    src_base += src_start[a] * src_strides[a];
    dst_base += dst_start[a] * dst_strides[a];
  }
  return Strided(ctx, src, dst, extent.dims(), src_strides, src_base, dst_strides, dst_base);
#else
  return NoKernels(ctx);
#endif
}

}  // namespace tessera::ops::movement
