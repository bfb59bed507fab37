// Host side of the CUDA cross-entropy kernels (ops/cuda/norm_softmax.cu): the
// labels checked on the host as the CPU checks them, given to the kernels as
// i64 on the device, and the shard's vocabulary offset from the slice.

#include "ops/cuda/loss.h"

#include "core/text.h"
#include "ops/cpu/loss.h"
#include "ops/cuda/cast.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"

namespace tessera::ops::cuda {
namespace {

// The labels (input `index`) checked against the logical vocabulary, as
// i64 on the kernel's device (i32 ones widened into the workspace, or into
// `storage`, which keeps the copy alive, without one).
absl::StatusOr<const int64_t*> DeviceLabels(const KernelContext& ctx, int index, int64_t vocab, Tensor& storage) {
  const Tensor& labels = ctx.input(index);
  ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(labels.shape(), labels.dtype(), Device{}));
  // An input register is complete: read without waiting for the stream's
  // queue (the forward's kernels before this one).
  RETURN_IF_ERROR(Done(CopyReady(host.raw_data(), labels.raw_data(), labels.NumBytes()), "labels read"));
  ASSIGN_OR_RETURN(const std::vector<int64_t> checked, cpu::ReadLabels(host, vocab));
  if (labels.dtype() == DType::kI64) return static_cast<const int64_t*>(labels.raw_data());
  // i32: widened into the planned workspace (ops/loss.cc) by a cast kernel
  // on the stream, behind the kernels that may still read the workspace
  // (the host waits for none of them); an eager call without one allocates
  // and copies the checked labels, waiting.
  const auto bytes = static_cast<size_t>(labels.NumElements()) * sizeof(int64_t);
  if (ctx.workspace.defined() && ctx.workspace.NumBytes() >= bytes) {
    RETURN_IF_ERROR(Done(LaunchCast(labels.raw_data(), CastCode(DType::kI32), ctx.workspace.raw_data(),
                                    CastCode(DType::kI64), labels.NumElements()),
                         "labels widening"));
    return static_cast<const int64_t*>(ctx.workspace.raw_data());
  }
  ASSIGN_OR_RETURN(storage, Tensor::Empty(labels.shape(), DType::kI64, ctx.device));
  RETURN_IF_ERROR(Done(Copy(storage.raw_data(), checked.data(), checked.size() * sizeof(int64_t)), "labels write"));
  return static_cast<const int64_t*>(storage.raw_data());
}

}  // namespace

absl::Status CrossEntropyPartialsKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const TensorSlice slice = ctx.input_slice(0);
  Tensor storage;
  ASSIGN_OR_RETURN(const int64_t* labels, DeviceLabels(ctx, 2, slice.logical[1], storage));
  const Tensor& logits = ctx.input(0);
  return Done(
      LaunchCrossEntropyPartials(logits.data<float>(), ctx.input(1).data<float>(), labels, ctx.output(0).data<float>(),
                                 ctx.output(1).data<float>(), logits.shape()[0], logits.shape()[1], slice.offset[1]),
      "cross_entropy_partials");
}

absl::Status CrossEntropyPartialsGradKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const TensorSlice slice = ctx.input_slice(0);
  Tensor storage;
  ASSIGN_OR_RETURN(const int64_t* labels, DeviceLabels(ctx, 2, slice.logical[1], storage));
  const Tensor& logits = ctx.input(0);
  const DType dtype = ctx.output(0).dtype();
  return Done(
      LaunchCrossEntropyPartialsGrad(logits.data<float>(), ctx.input(1).data<float>(), labels,
                                     ctx.input(3).data<float>(), ctx.input(4).data<float>(), ctx.output(0).raw_data(),
                                     dtype == DType::kBF16  ? 1
                                     : dtype == DType::kF16 ? 2
                                                            : 0,
                                     logits.shape()[0], logits.shape()[1], slice.offset[1]),
      "cross_entropy_partials_grad");
}

absl::Status SparseSoftmaxCrossEntropyKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& logits = ctx.input(0);
  Tensor storage;
  ASSIGN_OR_RETURN(const int64_t* labels, DeviceLabels(ctx, 1, logits.shape()[1], storage));
  return Done(LaunchSparseCrossEntropy(logits.data<float>(), labels, ctx.output(0).data<float>(), logits.shape()[0],
                                       logits.shape()[1]),
              "sparse_softmax_cross_entropy");
}

absl::Status SparseSoftmaxCrossEntropyGradKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const Tensor& logits = ctx.input(0);
  Tensor storage;
  ASSIGN_OR_RETURN(const int64_t* labels, DeviceLabels(ctx, 1, logits.shape()[1], storage));
  return Done(LaunchSparseCrossEntropyGrad(logits.data<float>(), labels, ctx.input(2).data<float>(),
                                           ctx.output(0).data<float>(), logits.shape()[0], logits.shape()[1]),
              "sparse_softmax_cross_entropy_grad");
}

}  // namespace tessera::ops::cuda
