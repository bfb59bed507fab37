// Host side of the CUDA fused attention (ops/cuda/attention.cu).

#include "ops/cuda/attention.h"

#include "core/text.h"
#include "ops/cpu/attention.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

absl::StatusOr<AttentionShape> Prepare(KernelContext& ctx, bool masked, const char* what) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const AttentionShape shape = AttentionShapeOf(ctx, masked);
  if (shape.head_dim > kMaxAttentionHeadDim) {
    return absl::UnimplementedError(
        StrCat(what, " on cuda: head dim ", shape.head_dim, " is over the kernel's ", kMaxAttentionHeadDim));
  }
  return shape;
}

// The context's workspace as `n` floats, or null when it has none that big.
float* WorkspaceFloats(const KernelContext& ctx, int64_t n) {
  if (!ctx.workspace.defined() || static_cast<int64_t>(ctx.workspace.NumBytes()) < n * 4) return nullptr;
  return static_cast<float*>(ctx.workspace.raw_data());
}

}  // namespace

absl::Status FlashAttentionKernel(KernelContext& ctx) {
  ASSIGN_OR_RETURN(const AttentionShape shape, Prepare(ctx, ctx.num_inputs() == 4, "flash_attention"));
  float* y = ctx.output(0).data<float>();
  float* lse = ctx.output(1).data<float>();
  const DType dtype = ctx.input(0).dtype();
  if (dtype != DType::kF32) {  // bf16 / f16: tensor cores
    return Done(LaunchFlashAttention16(dtype == DType::kBF16, ctx.input(0).raw_data(), ctx.input(1).raw_data(),
                                       ctx.input(2).raw_data(), y, lse, shape),
                "flash_attention");
  }
  return Done(LaunchFlashAttention(ctx.input(0).data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                                   y, lse, shape),
              "flash_attention");
}

absl::Status FlashAttentionGradKernel(KernelContext& ctx) {
  ASSIGN_OR_RETURN(const AttentionShape shape, Prepare(ctx, ctx.num_inputs() == 7, "flash_attention_grad"));
  float* delta = WorkspaceFloats(ctx, shape.batch * shape.heads * shape.queries);
  const float* y = ctx.input(3).data<float>();
  const float* lse = ctx.input(4).data<float>();
  const float* dy = ctx.input(5).data<float>();
  const DType dtype = ctx.input(0).dtype();
  if (dtype != DType::kF32) {
    return Done(LaunchFlashAttentionGrad16(dtype == DType::kBF16, ctx.input(0).raw_data(), ctx.input(1).raw_data(),
                                           ctx.input(2).raw_data(), y, lse, dy, ctx.output(0).raw_data(),
                                           ctx.output(1).raw_data(), ctx.output(2).raw_data(), delta, shape),
                "flash_attention_grad");
  }
  return Done(LaunchFlashAttentionGrad(ctx.input(0).data<float>(), ctx.input(1).data<float>(),
                                       ctx.input(2).data<float>(), y, lse, dy, ctx.output(0).data<float>(),
                                       ctx.output(1).data<float>(), ctx.output(2).data<float>(), delta, shape),
              "flash_attention_grad");
}

}  // namespace tessera::ops::cuda
