#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "core/config.h"
#include "core/status.h"
#include "models/model.h"
#include "train/engine.h"

namespace tessera {
namespace {

absl::StatusOr<graph::OptimizerOptions> OptimizerFromConfig(const nlohmann::json& config) {
  graph::OptimizerOptions o;
  ASSIGN_OR_RETURN(std::string target, config::GetString(config, "optim._target_"));
  if (target == "AdamW") {
    o.kind = graph::OptimizerKind::kAdamW;
    if (auto betas = config::GetNode(config, "optim.betas"); betas.ok() && (*betas)->is_array() && (*betas)->size() == 2) {
      o.beta1 = (**betas)[0].get<double>();
      o.beta2 = (**betas)[1].get<double>();
    }
    if (auto eps = config::GetDouble(config, "optim.eps"); eps.ok()) o.eps = *eps;
  } else if (target == "SGD") {
    o.kind = graph::OptimizerKind::kSgd;
    if (auto momentum = config::GetDouble(config, "optim.momentum"); momentum.ok()) o.momentum = *momentum;
  } else {
    return absl::InvalidArgumentError(StrCat("optim._target_ '", target, "' is not supported (AdamW or SGD)"));
  }
  if (auto wd = config::GetDouble(config, "optim.weight_decay"); wd.ok()) o.weight_decay = *wd;
  if (auto clip = config::GetNode(config, "optim.clip_grad_max_norm"); clip.ok() && !(*clip)->is_null()) {
    if (!(*clip)->is_number()) return absl::InvalidArgumentError("optim.clip_grad_max_norm must be a number or null");
    o.clip_grad_max_norm = (*clip)->get<double>();
  }
  if (auto type = config::GetNode(config, "optim.clip_grad_norm_type"); type.ok() && (*type)->is_number() && (*type)->get<double>() != 2.0) {
    return absl::InvalidArgumentError("optim.clip_grad_norm_type: only 2.0 is supported");
  }
  if (auto no_decay = config::GetBool(config, "optim.no_decay_norm_and_bias"); no_decay.ok() && !*no_decay) {
    o.no_weight_decay_patterns.clear();
  }
  return o;
}

absl::StatusOr<WarmupCosineLR> ScheduleFromConfig(const nlohmann::json& config, double base_lr, int64_t iters) {
  WarmupCosineLR s;
  s.base_lr = base_lr;
  s.max_iters = iters;
  auto node = config::GetNode(config, "lr_scheduler");
  if (!node.ok() || (*node)->is_null()) {
    s.warmup_factor = 1.0;
    s.alpha = 1.0;  // constant
    return s;
  }
  ASSIGN_OR_RETURN(std::string target, config::GetString(config, "lr_scheduler._target_"));
  if (target == "ConstantLR") {
    s.warmup_factor = 1.0;
    s.alpha = 1.0;
    return s;
  }
  if (target != "WarmupCosineLR") {
    return absl::InvalidArgumentError(StrCat("lr_scheduler._target_ '", target, "' is not supported (WarmupCosineLR or ConstantLR)"));
  }
  if (auto v = config::GetDouble(config, "lr_scheduler.warmup_factor"); v.ok()) s.warmup_factor = *v;
  if (auto v = config::GetDouble(config, "lr_scheduler.alpha"); v.ok()) s.alpha = *v;
  if (auto v = config::GetString(config, "lr_scheduler.warmup_method"); v.ok()) {
    if (*v != "linear" && *v != "constant") return absl::InvalidArgumentError(StrCat("lr_scheduler.warmup_method '", *v, "' (linear or constant)"));
    s.linear_warmup = *v == "linear";
  }
  double ratio = 0;
  if (auto v = config::GetDouble(config, "train.warmup_ratio"); v.ok()) ratio = *v;
  s.warmup_iters = static_cast<int64_t>(std::llround(ratio * static_cast<double>(iters)));
  return s;
}

}  // namespace

double WarmupCosineLR::At(int64_t iteration) const {
  if (iteration < warmup_iters) {
    if (!linear_warmup) return base_lr * warmup_factor;
    const double a = static_cast<double>(iteration) / static_cast<double>(warmup_iters);
    return base_lr * (warmup_factor * (1 - a) + a);
  }
  const int64_t span = std::max<int64_t>(1, max_iters - warmup_iters);
  const double progress = std::min(1.0, static_cast<double>(iteration - warmup_iters) / static_cast<double>(span));
  const double cosine = 0.5 * (1 + std::cos(std::numbers::pi * progress));
  return base_lr * ((1 - alpha) * cosine + alpha);
}

namespace {
struct Job {
  int64_t iters = 0, log_period = 0, batch = 0;
  std::string output_dir;
  std::unique_ptr<models::Model> model;
  CompileOptions options;
  WarmupCosineLR schedule;
  std::unique_ptr<Engine> engine;
};

absl::StatusOr<Job> Prepare(const nlohmann::json& config) {
  Job job;
  ASSIGN_OR_RETURN(job.iters, config::GetInt(config, "train.train_iter"));
  ASSIGN_OR_RETURN(job.log_period, config::GetInt(config, "train.log_period"));
  ASSIGN_OR_RETURN(job.batch, config::GetInt(config, "train.train_micro_batch_size"));
  ASSIGN_OR_RETURN(job.output_dir, config::GetString(config, "train.output_dir"));
  if (job.iters < 1) return absl::InvalidArgumentError(StrCat("train.train_iter must be >= 1, got ", job.iters));
  if (job.log_period < 1) return absl::InvalidArgumentError(StrCat("train.log_period must be >= 1, got ", job.log_period));
  if (auto acc = config::GetNode(config, "train.num_accumulation_steps"); acc.ok() && !(*acc)->is_null() &&
                                                                          !((*acc)->is_number_integer() && (*acc)->get<int64_t>() == 1)) {
    return absl::UnimplementedError("train.num_accumulation_steps > 1 is not supported yet (use null or 1)");
  }
  if (auto dp = config::GetInt(config, "train.dist.data_parallel_size"); dp.ok() && *dp != 1) {
    return absl::UnimplementedError("only one device is supported yet (train.dist.data_parallel_size=1)");
  }
  ASSIGN_OR_RETURN(const nlohmann::json* model_node, config::GetNode(config, "model"));
  Registry<models::Model> registry("model");
  RETURN_IF_ERROR(models::RegisterBuiltinModels(registry));
  ASSIGN_OR_RETURN(job.model, registry.Create(*model_node));
  ASSIGN_OR_RETURN(graph::Graph graph, job.model->BuildGraph(job.batch));
  ASSIGN_OR_RETURN(job.options.optimizer, OptimizerFromConfig(config));
  ASSIGN_OR_RETURN(double base_lr, config::GetDouble(config, "optim.lr"));
  ASSIGN_OR_RETURN(job.schedule, ScheduleFromConfig(config, base_lr, job.iters));
  ASSIGN_OR_RETURN(job.engine, Engine::Compile(std::move(graph), job.options));
  return job;
}
}  // namespace

absl::StatusOr<proto::Plan> TrainingPlan(const nlohmann::json& config) {
  ASSIGN_OR_RETURN(Job job, Prepare(config));
  return job.engine->Plan(job.iters);
}

absl::StatusOr<TrainSummary> Train(const nlohmann::json& config, std::FILE* progress) {
  ASSIGN_OR_RETURN(Job job, Prepare(config));
  const int64_t iters = job.iters, log_period = job.log_period, batch = job.batch;
  const std::string& output_dir = job.output_dir;
  const CompileOptions& options = job.options;
  const WarmupCosineLR& schedule = job.schedule;
  models::Model* model = job.model.get();
  Engine* engine = job.engine.get();
  std::error_code ec;
  std::filesystem::create_directories(output_dir, ec);
  if (ec) return absl::InternalError(StrCat("cannot create train.output_dir '", output_dir, "': ", ec.message()));
  const std::filesystem::path dir(output_dir);
  RETURN_IF_ERROR(config::SaveConfig(config, dir / "config.json"));
  std::ofstream metrics(dir / "metrics.jsonl", std::ios::trunc);
  if (!metrics) return absl::InternalError(StrCat("cannot write ", (dir / "metrics.jsonl").string()));

  TrainSummary summary;
  summary.losses.assign(static_cast<size_t>(iters), NAN);
  auto last_log = std::chrono::steady_clock::now();
  int64_t last_log_iter = -1;
  const auto feed = [&](int64_t iteration, std::string_view input, const Tensor& out) -> absl::Status {
    if (input == options.optimizer.lr_input_name) {
      Tensor t = out;
      return t.CopyFrom(Tensor::FromVector(Shape{}, std::vector<float>{static_cast<float>(schedule.At(iteration))}));
    }
    return model->FillBatch(iteration, input, out);
  };
  const auto fetch = [&](int64_t iteration, const std::map<std::string, Tensor>& values) -> absl::Status {
    const double loss = values.at("loss").ToVector<float>().at(0);
    summary.losses[static_cast<size_t>(iteration)] = loss;
    if (!std::isfinite(loss)) return absl::InternalError(StrCat("loss is ", loss, " at iteration ", iteration));
    if ((iteration + 1) % log_period != 0 && iteration + 1 != iters) return absl::OkStatus();
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_log).count();
    const double samples = static_cast<double>((iteration - last_log_iter) * batch);
    last_log = now;
    last_log_iter = iteration;
    nlohmann::json line = {{"iter", iteration + 1}, {"loss", loss}, {"lr", schedule.At(iteration)},
                           {"grad_norm", nullptr}, {"samples_per_s", seconds > 0 ? samples / seconds : 0.0}};
    if (auto it = values.find("grad_norm"); it != values.end()) line["grad_norm"] = it->second.ToVector<float>().at(0);
    metrics << line.dump() << "\n";
    metrics.flush();
    if (progress != nullptr) {
      std::fprintf(progress, "iter %lld/%lld  loss %.6f  lr %.3g  grad_norm %s  samples/s %.0f\n",
                   static_cast<long long>(iteration + 1), static_cast<long long>(iters), loss, schedule.At(iteration),
                   line["grad_norm"].dump().c_str(), line["samples_per_s"].get<double>());
      std::fflush(progress);
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(engine->Run(iters, feed, fetch));
  if (!metrics) return absl::InternalError("writing metrics.jsonl failed");
  return summary;
}

}  // namespace tessera
