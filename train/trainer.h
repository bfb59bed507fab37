#pragma once
// The minimal trainer (DESIGN §10): reads a resolved config, builds the model
// (config `model`, `_target_` from models::RegisterBuiltinModels), compiles it with
// the optimizer of `optim` (AdamW or SGD), runs train.train_iter iterations
// through the Engine and writes, in train.output_dir:
//   - config.json: the resolved config (atomic SaveConfig), before training;
//   - metrics.jsonl: one JSON object per logged iteration (every
//     train.log_period and the last): iter, loss, lr, grad_norm (null without
//     clipping), samples_per_s.
// The learning rate follows `lr_scheduler` (WarmupCosineLR, or constant when
// the key is absent / "ConstantLR").
// train.num_accumulation_steps = m > 1 accumulates gradients over m
// micro-batches of train.train_micro_batch_size samples (global batch m·b).
// Not done: several devices, checkpoints, eval.

#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"
#include "nlohmann/json.hpp"
#include "train/engine.h"

namespace tessera {

// LiBai's WarmupCosineLR: linear (or constant) warm-up from
// base * warmup_factor over warmup_iters, then cosine decay to base * alpha
// at max_iters.
struct WarmupCosineLR {
  double base_lr = 1e-3;
  int64_t max_iters = 1;
  int64_t warmup_iters = 0;
  double warmup_factor = 0.001;
  double alpha = 0.0;
  bool linear_warmup = true;
  double At(int64_t iteration) const;
};

struct TrainSummary {
  std::vector<double> losses;  // every iteration
};

// The plan Train would run (same config checks), for `tessera plan`.
absl::StatusOr<proto::Plan> TrainingPlan(const nlohmann::json& config);

// `progress` (may be null) gets one line per logged iteration. `executor`
// runs the plan (empty: the actor runtime in this process; see engine.h).
absl::StatusOr<TrainSummary> Train(const nlohmann::json& config, std::FILE* progress = nullptr,
                                   PlanExecutor executor = {});

}  // namespace tessera
