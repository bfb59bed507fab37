// Host side of the CUDA random ops: the shard's runs of global indices
// (ops/random_runs.h), dropout's rate as the CPU turns it into an integer
// threshold and a scale, uniform's bounds as the CPU clamps them, then
// ops/cuda/random.cu.

#include "ops/cuda/random.h"

#include <cmath>

#include "core/text.h"
#include "ops/cpu/random.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"
#include "ops/random_runs.h"

namespace tessera::ops::cuda {
namespace {

// The runs of `slice` for the kernels (an error past kMaxRank outer axes).
absl::StatusOr<RandomRuns> RunsOf(const TensorSlice& slice, const char* op) {
  const GlobalIndexer indexer(slice);
  if (indexer.outer_rank() > kMaxRank) {
    return absl::UnimplementedError(StrCat("CUDA ", op, " up to rank ", kMaxRank, ", got ", indexer.outer_rank()));
  }
  RandomRuns runs;
  runs.outer_rank = indexer.outer_rank();
  runs.run_length = indexer.run_length();
  runs.base = indexer.base();
  for (int a = 0; a < runs.outer_rank; ++a) {
    runs.outer_local[a] = indexer.outer_local()[static_cast<size_t>(a)];
    runs.outer_strides[a] = indexer.outer_strides()[static_cast<size_t>(a)];
  }
  return runs;
}

uint64_t Seed(const KernelContext& ctx) { return static_cast<uint64_t>(ctx.attr().Int("seed")); }
uint32_t TensorId(const KernelContext& ctx) { return static_cast<uint32_t>(ctx.attr().Int("tensor_id")); }

}  // namespace

absl::Status DropoutKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const double rate = ctx.attr().Float("rate");
  ASSIGN_OR_RETURN(const RandomRuns runs, RunsOf(ctx.input_slice(0), "dropout"));
  const int32_t threshold = cpu::DropoutThreshold(rate);  // as on the CPU
  const float scale = rate == 0.0 ? 1.0f : static_cast<float>(1.0 / (1.0 - rate));
  return Done(LaunchDropout(ctx.input(0).data<float>(), ctx.output(0).data<float>(), ctx.input(0).NumElements(),
                            Seed(ctx), TensorId(ctx), static_cast<uint32_t>(ctx.step), threshold, scale, runs),
              "dropout");
}

absl::Status BiasDropoutAddKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const double rate = ctx.attr().Float("rate");
  ASSIGN_OR_RETURN(const RandomRuns runs, RunsOf(ctx.input_slice(0), "bias_dropout_add"));
  const Tensor& x = ctx.input(0);
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const float scale = rate == 0.0 ? 1.0f : static_cast<float>(1.0 / (1.0 - rate));
  return Done(
      LaunchBiasDropoutAdd(x.data<float>(), ctx.input(1).data<float>(), ctx.input(2).data<float>(),
                           ctx.output(0).data<float>(), x.NumElements(), C, rate != 0.0, Seed(ctx), TensorId(ctx),
                           static_cast<uint32_t>(ctx.step), cpu::DropoutThreshold(rate), scale, runs),
      "bias_dropout_add");
}

absl::Status UniformKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  ASSIGN_OR_RETURN(const RandomRuns runs, RunsOf(ctx.output_slice(0), "uniform"));
  const float low = static_cast<float>(ctx.attr().Float("low"));
  const float high = static_cast<float>(ctx.attr().Float("high"));
  // low + span * u can round up to high; the contract is [low, high).
  const float below_high = low < high ? std::nextafter(high, low) : low;
  return Done(LaunchUniform(ctx.output(0).data<float>(), ctx.output(0).NumElements(), Seed(ctx), TensorId(ctx),
                            static_cast<uint32_t>(ctx.step), low, high - low, below_high, runs),
              "uniform");
}

absl::Status NormalKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  ASSIGN_OR_RETURN(const RandomRuns runs, RunsOf(ctx.output_slice(0), "normal"));
  return Done(LaunchNormal(ctx.output(0).data<float>(), ctx.output(0).NumElements(), Seed(ctx), TensorId(ctx),
                           static_cast<uint32_t>(ctx.step), static_cast<float>(ctx.attr().Float("mean")),
                           static_cast<float>(ctx.attr().Float("std")), runs),
              "normal");
}

}  // namespace tessera::ops::cuda
