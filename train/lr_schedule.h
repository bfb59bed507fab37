#pragma once
// Learning-rate schedules, as LiBai's (`lr_scheduler` by `_target_`), and
// the schema of their keys.
//
// LiBai's schedules, value for value: LiBai wraps OneFlow's decay schedule
// in WarmUpLR (warmup_prefix false), so the decay runs on the iteration
// counted from 0 to T = train.train_iter, warmup included, and the warmup
// ramps up to the decay's value at its end. With
//   W = ceil(train.warmup_ratio × T)      (LiBai's default trainer)
// and the decay D(i) (p = min(i, T) / T):
//   WarmupCosineLR     D(i) = base × ((1 − alpha) × (1 + cos(π p)) / 2 + alpha)
//   WarmupLinearLR     D(i) = base × ((1 − alpha) × (1 − p) + alpha)   (Tessera's;
//                      LiBai has none)
//   WarmupMultiStepLR  D(i) = base × gamma^k, k = the milestones m with m ≤ i
//   WarmupPolynomialLR D(i) = (base − end) × (1 − p)^power + end, end =
//                      end_learning_rate (absolute; OneFlow's PolynomialLR
//                      without cycle)
//   ConstantLR         base for every i (no warmup)
// the learning rate of iteration i is
//   i ≥ W:            D(i)
//   i < W, linear:    base × (f + (D(W)/base − f) × i/W), f = warmup_factor
//   i < W, constant:  base × f
// so the peak, base, is reached only without warmup; with it the schedule
// meets the decay at W (LiBai's curves: a warmup of 10 % of a cosine run
// peaks at D(W) = base × 0.976 for alpha 0.01). Past T the schedules hold
// their value at T.
//
// Each target's keys are declared once, with the struct they fill, through
// config::Binding; LrSchedulerSection() is the `lr_scheduler` section of the
// job schema and MakeLrSchedule() turns its resolved node into a schedule.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/schema.h"
#include "nlohmann/json.hpp"

namespace tessera {

// LiBai's WarmupCosineLR.
struct WarmupCosineLRConfig {
  double warmup_factor = 0.001;
  std::string warmup_method = "linear";
  double alpha = 0.01;
};

// Linear decay from base (end of the warmup) to base × alpha (train_iter).
struct WarmupLinearLRConfig {
  double warmup_factor = 0.001;
  std::string warmup_method = "linear";
  double alpha = 0.0;
};

// LiBai's WarmupMultiStepLR.
struct WarmupMultiStepLRConfig {
  double warmup_factor = 0.001;
  std::string warmup_method = "linear";
  std::vector<int64_t> milestones;
  double gamma = 0.1;
};

// LiBai's WarmupPolynomialLR (OneFlow's PolynomialLR after the warmup;
// its `cycle` only acts past train_iter, where every schedule here holds
// its last value, so it is not a key).
struct WarmupPolynomialLRConfig {
  double warmup_factor = 0.001;
  std::string warmup_method = "linear";
  double end_learning_rate = 1e-4;
  double power = 1.0;
};

// The bindings (schema + reader) of each target.
const config::Binding<WarmupCosineLRConfig>& WarmupCosineLRKeys();
const config::Binding<WarmupLinearLRConfig>& WarmupLinearLRKeys();
const config::Binding<WarmupMultiStepLRConfig>& WarmupMultiStepLRKeys();
const config::Binding<WarmupPolynomialLRConfig>& WarmupPolynomialLRKeys();

// The `lr_scheduler` section: targets WarmupCosineLR (the default, as
// LiBai's configs/common), WarmupLinearLR, WarmupMultiStepLR,
// WarmupPolynomialLR and ConstantLR.
config::Section LrSchedulerSection();

// The learning rate of every iteration of one job. An immutable value,
// safe to share between threads; made by MakeLrSchedule.
class LrSchedule {
 public:
  enum class Kind { kConstant, kWarmupCosine, kWarmupLinear, kWarmupMultiStep, kWarmupPolynomial };

  // The learning rate of `iteration` (from 0; TESSERA_CHECKed ≥ 0). Any
  // iteration is allowed: past train_iter the schedule holds its last value
  // (the multi-step one keeps its last factor).
  [[nodiscard]] double At(int64_t iteration) const;

  Kind kind() const { return kind_; }
  double base_lr() const { return base_lr_; }
  // Iterations of warmup (0 for ConstantLR).
  int64_t warmup_iters() const { return warmup_iters_; }
  int64_t train_iter() const { return train_iter_; }

 private:
  friend absl::StatusOr<LrSchedule> MakeLrSchedule(const nlohmann::json&, double, int64_t, double);
  LrSchedule() = default;

  // The schedule without its warmup (OneFlow's decay schedule that
  // LiBai's wraps), at `iteration` counted from 0.
  double Decayed(int64_t iteration) const;

  Kind kind_ = Kind::kConstant;
  double base_lr_ = 0;
  int64_t train_iter_ = 1;
  int64_t warmup_iters_ = 0;
  double warmup_factor_ = 1;
  bool linear_warmup_ = true;
  double alpha_ = 1;                 // cosine, linear
  std::vector<int64_t> milestones_;  // multi-step: strictly increasing
  double gamma_ = 1;                 // multi-step
  double end_lr_ = 0;                // polynomial
  double power_ = 1;                 // polynomial
};

// The schedule of a resolved `lr_scheduler` node (Resolve(LrSchedulerSection)
// made it: `_target_` present, every key valid), with the optimizer's
// `base_lr` (> 0), `train_iter` (≥ 1) and `warmup_ratio` (in [0, 1]) from
// `train`. INVALID_ARGUMENT, one line naming the key, for what the schema
// cannot check alone: milestones not strictly increasing or past train_iter;
// also for arguments out of range or an unresolved node.
[[nodiscard]] absl::StatusOr<LrSchedule> MakeLrSchedule(const nlohmann::json& resolved_lr_scheduler_node,
                                                        double base_lr, int64_t train_iter, double warmup_ratio);

}  // namespace tessera
