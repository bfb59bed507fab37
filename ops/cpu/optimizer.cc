// CPU kernels of sgd_update, adamw_update, nonfinite and loss_scale_update.
//
// Outputs may alias inputs (in-place updates), so pointers are not restrict:
// every element's inputs are read before its outputs are written, which is
// correct under exact aliasing. The loops still vectorise: sgd's through GCC's
// run-time overlap check (which accepts an output equal to an input), adamw's,
// with more arrays than that check covers, through per-tile local results.
// Loop bodies capture by value: captured references would be reloaded after
// every store, since a float store might change them.

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#include "ops/cpu/cpu_util.h"
#include "ops/update_formulas.h"

namespace tessera::ops::cpu {
namespace {

float LearningRate(const KernelContext& ctx, int input) { return ctx.input(input).data<float>()[0]; }

// The optional skip input after lr is set: the outputs get the inputs'
// values (nothing when they alias them, as in place). Returns whether so.
bool Skipped(const KernelContext& ctx, int skip_input, int num_outputs) {
  if (ctx.num_inputs() <= skip_input || ctx.input(skip_input).data<float>()[0] == 0.0f) return false;
  for (int k = 0; k < num_outputs; ++k) {
    const int from = k == 0 ? 0 : k + 1;  // param, then the state (after grad)
    if (ctx.output(k).raw_data() != ctx.input(from).raw_data()) {
      std::memcpy(ctx.output(k).raw_data(), ctx.input(from).raw_data(), ctx.input(from).NumBytes());
    }
  }
  return true;
}

}  // namespace

absl::Status NonfiniteKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t n = x.NumElements();
  std::atomic<bool> found{false};
  ParallelFor(ctx, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    bool any = false;
    if (x.dtype() == DType::kF32) {
      const float* v = x.data<float>();
      for (int64_t i = begin; i < end; ++i) any |= !std::isfinite(v[i]);
    } else {
      // bf16 and f16: all exponent bits set.
      const auto* bits = static_cast<const uint16_t*>(x.raw_data());
      const uint16_t exponent = x.dtype() == DType::kBF16 ? 0x7f80 : 0x7c00;
      for (int64_t i = begin; i < end; ++i) any |= (bits[i] & exponent) == exponent;
    }
    if (any) found.store(true, std::memory_order_relaxed);
  });
  ctx.output(0).data<float>()[0] = found.load() ? 1.0f : 0.0f;
  return absl::OkStatus();
}

absl::Status LossScaleUpdateKernel(KernelContext& ctx) {
  const float scale = ctx.input(0).data<float>()[0];
  const bool found_inf = ctx.input(1).data<float>()[0] != 0.0f;
  const float good = ctx.input(2).data<float>()[0];
  float new_scale = scale, new_good = 0.0f;
  if (found_inf) {
    new_scale = static_cast<float>(scale * ctx.attr().Float("backoff"));
  } else if (good + 1.0f >= static_cast<float>(ctx.attr().Int("growth_interval"))) {
    // (A scale that would overflow f32 stays: an inf one skipped every
    // step from then on, as PyTorch's GradScaler does not.)
    const auto grown = static_cast<float>(scale * ctx.attr().Float("growth"));
    if (std::isfinite(grown)) new_scale = grown;
  } else {
    new_good = good + 1.0f;
  }
  ctx.output(0).data<float>()[0] = new_scale;
  ctx.output(1).data<float>()[0] = new_good;
  return absl::OkStatus();
}

absl::Status SgdUpdateKernel(KernelContext& ctx) {
  const float momentum = static_cast<float>(ctx.attr().Float("momentum"));
  const float weight_decay = static_cast<float>(ctx.attr().Float("weight_decay"));
  const float* param = ctx.input(0).data<float>();
  const float* grad = ctx.input(1).data<float>();
  float* new_param = ctx.output(0).data<float>();
  if (ctx.attr().Float("momentum") == 0) {
    // No buffer: (param, grad, lr[, skip]) -> param'.
    if (Skipped(ctx, 3, 1)) return absl::OkStatus();
    const float lr = LearningRate(ctx, 2);
    ParallelFor(ctx, ctx.input(0).NumElements(), kElementwiseGrain, [=](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float unused;
        SgdElement(param[i], grad[i], 0.0f, lr, 0.0f, weight_decay, false, &new_param[i], &unused);
      }
    });
    return absl::OkStatus();
  }
  if (Skipped(ctx, 4, 2)) return absl::OkStatus();
  const float lr = LearningRate(ctx, 3);
  const bool nesterov = ctx.attr().Bool("nesterov");
  const float* buf = ctx.input(2).data<float>();
  float* new_buf = ctx.output(1).data<float>();
  ParallelFor(ctx, ctx.input(0).NumElements(), kElementwiseGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      SgdElement(param[i], grad[i], buf[i], lr, momentum, weight_decay, nesterov, &new_param[i], &new_buf[i]);
    }
  });
  return absl::OkStatus();
}

absl::Status AdamwUpdateKernel(KernelContext& ctx) {
  if (Skipped(ctx, 5, 3)) return absl::OkStatus();
  const double lr = LearningRate(ctx, 4);
  const double beta1 = ctx.attr().Float("beta1"), beta2 = ctx.attr().Float("beta2");
  // t counts updates from 1: step 0 is the first; steps skipped for an
  // overflow (input 6, when given) do not count.
  const double skipped = ctx.num_inputs() > 6 ? static_cast<double>(ctx.input(6).data<float>()[0]) : 0.0;
  const AdamwScalars scalars =
      AdamwStepScalars(lr, beta1, beta2, ctx.attr().Float("weight_decay"), ctx.attr().Float("eps"),
                       ctx.attr().Bool("bias_correction"), static_cast<double>(ctx.step + 1) - skipped);
  const float* param = ctx.input(0).data<float>();
  const float* grad = ctx.input(1).data<float>();
  const float* m = ctx.input(2).data<float>();
  const float* v = ctx.input(3).data<float>();
  float* new_param = ctx.output(0).data<float>();
  float* new_m = ctx.output(1).data<float>();
  float* new_v = ctx.output(2).data<float>();
  // Seven arrays are more than GCC's run-time alias checks cover, so each
  // tile's results go to local arrays first (which cannot alias anything)
  // and are copied out after the tile's inputs have all been read.
  constexpr int64_t kTile = 256;
  ParallelFor(ctx, ctx.input(0).NumElements(), kElementwiseGrain, [=](int64_t begin, int64_t end) {
    float tile_param[kTile], tile_m[kTile], tile_v[kTile];
    for (int64_t start = begin; start < end; start += kTile) {
      const int64_t count = std::min(kTile, end - start);
      for (int64_t k = 0; k < count; ++k) {
        const int64_t i = start + k;
        AdamwElement(param[i], grad[i], m[i], v[i], scalars, &tile_param[k], &tile_m[k], &tile_v[k]);
      }
      const size_t bytes = static_cast<size_t>(count) * sizeof(float);
      std::memcpy(new_param + start, tile_param, bytes);
      std::memcpy(new_m + start, tile_m, bytes);
      std::memcpy(new_v + start, tile_v, bytes);
    }
  });
  return absl::OkStatus();
}

}  // namespace tessera::ops::cpu
