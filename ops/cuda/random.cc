// Host side of CUDA dropout: the rate as the CPU turns it into an integer
// threshold and a scale, the shard's runs of global indices
// (ops/random_runs.h), then ops/cuda/random.cu.

#include "ops/cuda/random.h"

#include "core/text.h"
#include "ops/cpu/random.h"
#include "ops/cuda/kernel_util.h"
#include "ops/cuda/launch.h"
#include "ops/random_runs.h"

namespace tessera::ops::cuda {

absl::Status DropoutKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(OnDevice(ctx));
  const double rate = ctx.attr().Float("rate");
  const GlobalIndexer indexer(ctx.input_slice(0));
  if (indexer.outer_rank() > kMaxRank) {
    return absl::UnimplementedError(StrCat("CUDA dropout up to rank ", kMaxRank, ", got ", indexer.outer_rank()));
  }
  DropoutRuns runs;
  runs.outer_rank = indexer.outer_rank();
  runs.run_length = indexer.run_length();
  runs.base = indexer.base();
  for (int a = 0; a < runs.outer_rank; ++a) {
    runs.outer_local[a] = indexer.outer_local()[static_cast<size_t>(a)];
    runs.outer_strides[a] = indexer.outer_strides()[static_cast<size_t>(a)];
  }
  const int32_t threshold = cpu::DropoutThreshold(rate);  // as on the CPU
  const float scale = rate == 0.0 ? 1.0f : static_cast<float>(1.0 / (1.0 - rate));
  return Done(
      LaunchDropout(ctx.input(0).data<float>(), ctx.output(0).data<float>(), ctx.input(0).NumElements(),
                    static_cast<uint64_t>(ctx.attr().Int("seed")), static_cast<uint32_t>(ctx.attr().Int("tensor_id")),
                    static_cast<uint32_t>(ctx.step), threshold, scale, runs),
      "dropout");
}

}  // namespace tessera::ops::cuda
