#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "core/status.h"

namespace tessera {
namespace {

using config::Binding;
using config::KeySpec;
using config::Section;

// The keys every warmup schedule shares; their specs are written once here.
KeySpec WarmupFactorSpec() {
  return {.min = 0, .max = 1, .doc = "learning-rate multiplier at the start of the warmup"};
}
KeySpec WarmupMethodSpec() {
  return {.choices = {"linear", "constant"},
          .doc =
              "shape of the warmup: `linear` from `warmup_factor` × lr up to the decayed learning rate at the "
              "warmup's end, or `constant` at `warmup_factor` × lr"};
}
KeySpec AlphaSpec() { return {.min = 0, .max = 1, .doc = "final learning rate as a fraction of the peak"}; }

Binding<WarmupCosineLRConfig> MakeWarmupCosineLRKeys() {
  Binding<WarmupCosineLRConfig> b(
      "LiBai's WarmupCosineLR: cosine decay from lr at iteration 0 to `alpha` × lr at `train.train_iter`, the first "
      "ceil(`train.warmup_ratio` × `train.train_iter`) iterations of it replaced by the warmup (LiBai's curve: the "
      "decay counts the warmup's iterations).");
  b.Field("warmup_factor", &WarmupCosineLRConfig::warmup_factor, WarmupFactorSpec());
  b.Field("alpha", &WarmupCosineLRConfig::alpha, AlphaSpec());
  b.Field("warmup_method", &WarmupCosineLRConfig::warmup_method, WarmupMethodSpec());
  return b;
}

Binding<WarmupLinearLRConfig> MakeWarmupLinearLRKeys() {
  Binding<WarmupLinearLRConfig> b(
      "Linear decay from lr at iteration 0 to `alpha` × lr at `train.train_iter`, the first "
      "ceil(`train.warmup_ratio` × `train.train_iter`) iterations of it replaced by the warmup, as LiBai's schedules.");
  b.Field("warmup_factor", &WarmupLinearLRConfig::warmup_factor, WarmupFactorSpec());
  b.Field("alpha", &WarmupLinearLRConfig::alpha, AlphaSpec());
  b.Field("warmup_method", &WarmupLinearLRConfig::warmup_method, WarmupMethodSpec());
  return b;
}

Binding<WarmupMultiStepLRConfig> MakeWarmupMultiStepLRKeys() {
  Binding<WarmupMultiStepLRConfig> b(
      "LiBai's WarmupMultiStepLR: the learning rate is multiplied by `gamma` at each milestone; the first "
      "ceil(`train.warmup_ratio` × `train.train_iter`) iterations are the warmup.");
  b.Field("warmup_factor", &WarmupMultiStepLRConfig::warmup_factor, WarmupFactorSpec());
  b.Field("milestones", &WarmupMultiStepLRConfig::milestones,
          {.min = 1,
           .doc = "iterations (from 0, strictly increasing, below `train.train_iter`) from which the learning rate "
                  "is multiplied by one more `gamma`; empty: none"});
  b.Field("gamma", &WarmupMultiStepLRConfig::gamma,
          {.min = 0, .max = 1, .exclusive_min = true, .doc = "factor applied at each milestone"});
  b.Field("warmup_method", &WarmupMultiStepLRConfig::warmup_method, WarmupMethodSpec());
  return b;
}

Binding<WarmupPolynomialLRConfig> MakeWarmupPolynomialLRKeys() {
  Binding<WarmupPolynomialLRConfig> b(
      "LiBai's WarmupPolynomialLR: polynomial decay (lr - end_learning_rate) × (1 - p)^power + end_learning_rate, "
      "p from 0 at iteration 0 to 1 at `train.train_iter`, the first ceil(`train.warmup_ratio` × `train.train_iter`) "
      "iterations of it replaced by the warmup. LiBai's `cycle` is not a key: it acts only past `train.train_iter`.");
  b.Field("warmup_factor", &WarmupPolynomialLRConfig::warmup_factor, WarmupFactorSpec());
  b.Field("end_learning_rate", &WarmupPolynomialLRConfig::end_learning_rate,
          {.min = 0, .doc = "learning rate at `train.train_iter` (absolute, not a fraction of lr); at most lr"});
  b.Field("power", &WarmupPolynomialLRConfig::power,
          {.min = 0, .max = 1e6, .exclusive_min = true, .doc = "exponent of the decay: 1 is linear"});
  b.Field("warmup_method", &WarmupPolynomialLRConfig::warmup_method, WarmupMethodSpec());
  return b;
}

// The milestone checks the schema cannot make: they relate elements to each
// other and to train.train_iter.
absl::Status CheckMilestones(const std::vector<int64_t>& milestones, int64_t train_iter) {
  for (size_t i = 0; i < milestones.size(); ++i) {
    if (i > 0 && milestones[i] <= milestones[i - 1]) {
      return absl::InvalidArgumentError(StrCat("lr_scheduler.milestones must be strictly increasing: milestones[", i,
                                               "] = ", milestones[i], " follows ", milestones[i - 1]));
    }
    if (milestones[i] >= train_iter) {
      return absl::InvalidArgumentError(
          StrCat("lr_scheduler.milestones[", i, "] = ", milestones[i],
                 " is never reached: the run's iterations are 0 to train.train_iter - 1 = ", train_iter - 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const Binding<WarmupCosineLRConfig>& WarmupCosineLRKeys() {
  static const auto* const keys = new Binding<WarmupCosineLRConfig>(MakeWarmupCosineLRKeys());
  return *keys;
}
const Binding<WarmupLinearLRConfig>& WarmupLinearLRKeys() {
  static const auto* const keys = new Binding<WarmupLinearLRConfig>(MakeWarmupLinearLRKeys());
  return *keys;
}
const Binding<WarmupMultiStepLRConfig>& WarmupMultiStepLRKeys() {
  static const auto* const keys = new Binding<WarmupMultiStepLRConfig>(MakeWarmupMultiStepLRKeys());
  return *keys;
}
const Binding<WarmupPolynomialLRConfig>& WarmupPolynomialLRKeys() {
  static const auto* const keys = new Binding<WarmupPolynomialLRConfig>(MakeWarmupPolynomialLRKeys());
  return *keys;
}

Section LrSchedulerSection() {
  return Section("The learning-rate schedule, by `_target_`.")
      .Target("WarmupCosineLR", WarmupCosineLRKeys().section())
      .Target("WarmupLinearLR", WarmupLinearLRKeys().section())
      .Target("WarmupMultiStepLR", WarmupMultiStepLRKeys().section())
      .Target("WarmupPolynomialLR", WarmupPolynomialLRKeys().section())
      .Target("ConstantLR", Section("The peak learning rate throughout, without warmup."))
      .DefaultTarget("WarmupCosineLR");
}

double LrSchedule::Decayed(int64_t iteration) const {
  switch (kind_) {
    case Kind::kConstant:
      return base_lr_;
    case Kind::kWarmupMultiStep: {
      // The milestones are sorted: those passed are the ones up to the first
      // milestone past `iteration`.
      const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), iteration) - milestones_.begin();
      return base_lr_ * std::pow(gamma_, static_cast<double>(passed));
    }
    case Kind::kWarmupPolynomial: {
      const double progress = static_cast<double>(std::min(iteration, train_iter_)) / static_cast<double>(train_iter_);
      return (base_lr_ - end_lr_) * std::pow(1 - progress, power_) + end_lr_;
    }
    case Kind::kWarmupCosine:
    case Kind::kWarmupLinear: {
      if (iteration >= train_iter_) return base_lr_ * alpha_;
      const double progress = static_cast<double>(iteration) / static_cast<double>(train_iter_);
      const double decay =
          kind_ == Kind::kWarmupCosine ? 0.5 * (1 + std::cos(std::numbers::pi * progress)) : 1 - progress;
      return base_lr_ * ((1 - alpha_) * decay + alpha_);
    }
  }
  return base_lr_;
}

double LrSchedule::At(int64_t iteration) const {
  TESSERA_CHECK(iteration >= 0, "learning rate of iteration ", iteration);
  if (iteration >= warmup_iters_) return Decayed(iteration);
  if (!linear_warmup_) return base_lr_ * warmup_factor_;
  // From warmup_factor × base to the decayed schedule's value at the end of
  // the warmup, where the decay takes over (OneFlow's LinearLR inside its
  // WarmUpLR).
  const double end_factor = Decayed(warmup_iters_) / base_lr_;
  const double a = static_cast<double>(iteration) / static_cast<double>(warmup_iters_);
  return base_lr_ * (warmup_factor_ + (end_factor - warmup_factor_) * a);
}

absl::StatusOr<LrSchedule> MakeLrSchedule(const nlohmann::json& resolved_lr_scheduler_node, double base_lr,
                                          int64_t train_iter, double warmup_ratio) {
  const nlohmann::json& node = resolved_lr_scheduler_node;
  if (!(std::isfinite(base_lr) && base_lr > 0)) {
    return absl::InvalidArgumentError(StrCat("learning rate must be finite and > 0, got ", base_lr));
  }
  if (train_iter < 1) return absl::InvalidArgumentError(StrCat("train.train_iter must be >= 1, got ", train_iter));
  if (!(warmup_ratio >= 0 && warmup_ratio <= 1)) {
    return absl::InvalidArgumentError(StrCat("train.warmup_ratio must be in [0, 1], got ", warmup_ratio));
  }
  const auto target_it = node.is_object() ? node.find("_target_") : node.end();
  if (target_it == node.end() || !target_it->is_string()) {
    return absl::InvalidArgumentError("lr_scheduler has no _target_ (not a resolved config)");
  }
  const std::string target = target_it->get<std::string>();

  LrSchedule s;
  s.base_lr_ = base_lr;
  s.train_iter_ = train_iter;
  if (target == "ConstantLR") return s;
  // Rounded up, as LiBai's default trainer does (math.ceil).
  s.warmup_iters_ = static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(train_iter)));
  const auto set_warmup = [&s](double warmup_factor, const std::string& method) {
    s.warmup_factor_ = warmup_factor;
    s.linear_warmup_ = method == "linear";
  };
  if (target == "WarmupCosineLR") {
    ASSIGN_OR_RETURN(const WarmupCosineLRConfig c, WarmupCosineLRKeys().Read(node));
    s.kind_ = LrSchedule::Kind::kWarmupCosine;
    set_warmup(c.warmup_factor, c.warmup_method);
    s.alpha_ = c.alpha;
  } else if (target == "WarmupLinearLR") {
    ASSIGN_OR_RETURN(const WarmupLinearLRConfig c, WarmupLinearLRKeys().Read(node));
    s.kind_ = LrSchedule::Kind::kWarmupLinear;
    set_warmup(c.warmup_factor, c.warmup_method);
    s.alpha_ = c.alpha;
  } else if (target == "WarmupMultiStepLR") {
    ASSIGN_OR_RETURN(WarmupMultiStepLRConfig c, WarmupMultiStepLRKeys().Read(node));
    RETURN_IF_ERROR(CheckMilestones(c.milestones, train_iter));
    s.kind_ = LrSchedule::Kind::kWarmupMultiStep;
    set_warmup(c.warmup_factor, c.warmup_method);
    s.milestones_ = std::move(c.milestones);
    s.gamma_ = c.gamma;
  } else if (target == "WarmupPolynomialLR") {
    ASSIGN_OR_RETURN(const WarmupPolynomialLRConfig c, WarmupPolynomialLRKeys().Read(node));
    if (c.end_learning_rate > base_lr) {
      return absl::InvalidArgumentError(StrCat("lr_scheduler.end_learning_rate ", c.end_learning_rate,
                                               " is above the learning rate ", base_lr, " it decays from"));
    }
    s.kind_ = LrSchedule::Kind::kWarmupPolynomial;
    set_warmup(c.warmup_factor, c.warmup_method);
    s.end_lr_ = c.end_learning_rate;
    s.power_ = c.power;
  } else {
    return absl::InvalidArgumentError(StrCat(
        "lr_scheduler._target_ '", target,
        "' is not a schedule (WarmupCosineLR, WarmupLinearLR, WarmupMultiStepLR, WarmupPolynomialLR, ConstantLR)"));
  }
  return s;
}

}  // namespace tessera
