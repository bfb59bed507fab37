#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numbers>
#include <optional>

#include "core/config.h"
#include "core/status.h"
#include "models/model.h"
#include "scheduler/mesh.h"
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

// train.dist -> the device mesh's numbers. The world is dp × tp × pp virtual
// devices; with data_parallel_size null it is train.dist.num_devices and dp
// is derived. pipeline_num_layers defaults to model.num_layers.
absl::StatusOr<scheduler::ParallelConfig> ParallelFromConfig(const nlohmann::json& config) {
  scheduler::ParallelConfig parallel;
  ASSIGN_OR_RETURN(std::string device_type, config::GetString(config, "train.dist.device_type"));
  if (device_type != "cpu") {
    return absl::UnimplementedError(StrCat("train.dist.device_type '", device_type, "': only \"cpu\" (virtual CPU devices) runs yet"));
  }
  ASSIGN_OR_RETURN(parallel.tensor, config::GetInt(config, "train.dist.tensor_parallel_size"));
  ASSIGN_OR_RETURN(parallel.pipeline, config::GetInt(config, "train.dist.pipeline_parallel_size"));
  const auto optional = [&](const char* key) -> absl::StatusOr<std::optional<int64_t>> {
    auto node = config::GetNode(config, key);
    if (!node.ok() || (*node)->is_null()) return std::optional<int64_t>();
    ASSIGN_OR_RETURN(int64_t value, config::GetInt(config, key));
    return std::optional<int64_t>(value);
  };
  ASSIGN_OR_RETURN(std::optional<int64_t> data, optional("train.dist.data_parallel_size"));
  ASSIGN_OR_RETURN(std::optional<int64_t> devices, optional("train.dist.num_devices"));
  if (data) {
    parallel.data = *data;
    parallel.world_size = *data * parallel.tensor * parallel.pipeline;
    if (devices && *devices != parallel.world_size) {
      return absl::InvalidArgumentError(StrCat("train.dist.num_devices ", *devices, " != data ", *data, " x tensor ", parallel.tensor,
                                               " x pipeline ", parallel.pipeline, " parallel sizes"));
    }
  } else {
    if (!devices) return absl::InvalidArgumentError("train.dist.data_parallel_size is null: set it or train.dist.num_devices");
    parallel.world_size = *devices;
  }
  if (auto custom = config::GetNode(config, "train.dist.custom_pipeline_stage_id"); custom.ok() && !(*custom)->is_null()) {
    return absl::UnimplementedError("train.dist.custom_pipeline_stage_id is not supported yet (use null: LiBai's automatic assignment)");
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> layers, optional("train.dist.pipeline_num_layers"));
  if (!layers) {
    ASSIGN_OR_RETURN(layers, optional("model.num_layers"));
  }
  if (layers) parallel.pipeline_num_layers = *layers;
  return parallel;
}

struct Job {
  int64_t iters = 0, log_period = 0, batch = 0;  // batch: per data-parallel rank and micro-batch
  int64_t data_parallel = 1;
  std::string output_dir;
  std::unique_ptr<models::Model> model;
  CompileOptions options;
  WarmupCosineLR schedule;
  std::unique_ptr<Engine> engine;
};

absl::StatusOr<Job> Prepare(const nlohmann::json& config, PlanExecutor executor = {}) {
  Job job;
  job.options.executor = std::move(executor);
  ASSIGN_OR_RETURN(job.iters, config::GetInt(config, "train.train_iter"));
  ASSIGN_OR_RETURN(job.log_period, config::GetInt(config, "train.log_period"));
  ASSIGN_OR_RETURN(job.batch, config::GetInt(config, "train.train_micro_batch_size"));
  ASSIGN_OR_RETURN(job.output_dir, config::GetString(config, "train.output_dir"));
  if (job.iters < 1) return absl::InvalidArgumentError(StrCat("train.train_iter must be >= 1, got ", job.iters));
  if (job.log_period < 1) return absl::InvalidArgumentError(StrCat("train.log_period must be >= 1, got ", job.log_period));
  if (job.batch < 1) return absl::InvalidArgumentError(StrCat("train.train_micro_batch_size must be >= 1, got ", job.batch));
  // global = micro × accumulation × data-parallel ranks: any two of micro,
  // accumulation and global give the third.
  const auto optional_int = [&](const char* key) -> absl::StatusOr<std::optional<int64_t>> {
    auto node = config::GetNode(config, key);
    if (!node.ok() || (*node)->is_null()) return std::optional<int64_t>();
    ASSIGN_OR_RETURN(int64_t value, config::GetInt(config, key));
    if (value < 1) return absl::InvalidArgumentError(StrCat(key, " must be >= 1, got ", value));
    return std::optional<int64_t>(value);
  };
  ASSIGN_OR_RETURN(std::optional<int64_t> accumulation, optional_int("train.num_accumulation_steps"));
  ASSIGN_OR_RETURN(std::optional<int64_t> global, optional_int("train.global_batch_size"));
  if (!accumulation) {
    if (global && *global % (job.batch * job.data_parallel) != 0) {
      return absl::InvalidArgumentError(StrCat("train.global_batch_size ", *global, " is not a multiple of train.train_micro_batch_size ",
                                               job.batch, " x ", job.data_parallel, " data-parallel ranks"));
    }
    accumulation = global ? *global / (job.batch * job.data_parallel) : 1;
  }
  if (global && *global != job.batch * *accumulation * job.data_parallel) {
    return absl::InvalidArgumentError(StrCat("train.global_batch_size ", *global, " != train.train_micro_batch_size ", job.batch,
                                             " x train.num_accumulation_steps ", *accumulation, " x ", job.data_parallel,
                                             " data-parallel ranks"));
  }
  job.options.num_micro_batches = *accumulation;
  ASSIGN_OR_RETURN(job.options.lower.parallel, ParallelFromConfig(config));
  if (auto threads = config::GetNode(config, "train.dist.intra_op_threads"); threads.ok() && !(*threads)->is_null()) {
    ASSIGN_OR_RETURN(int64_t n, config::GetInt(config, "train.dist.intra_op_threads"));
    if (n < 1 || n > 1024) return absl::InvalidArgumentError(StrCat("train.dist.intra_op_threads must be in [1, 1024], got ", n));
    job.options.intra_op_threads = static_cast<int>(n);
  }
  ASSIGN_OR_RETURN(const scheduler::DeviceMesh mesh, scheduler::DeviceMesh::Make(job.options.lower.parallel));
  job.data_parallel = mesh.data_parallel_size();
  ASSIGN_OR_RETURN(const nlohmann::json* model_node, config::GetNode(config, "model"));
  Registry<models::Model> registry("model");
  RETURN_IF_ERROR(models::RegisterBuiltinModels(registry));
  ASSIGN_OR_RETURN(job.model, registry.Create(*model_node));
  // The graph is built for the logical micro-batch: every data-parallel
  // rank's samples (the scheduler splits it).
  ASSIGN_OR_RETURN(graph::Graph graph, job.model->BuildGraph(job.batch * job.data_parallel));
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

absl::StatusOr<TrainSummary> Train(const nlohmann::json& config, std::FILE* progress, PlanExecutor executor) {
  ASSIGN_OR_RETURN(Job job, Prepare(config, std::move(executor)));
  const int64_t iters = job.iters, log_period = job.log_period, batch = job.batch * job.data_parallel;
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
  // Data: the model fills the iteration's global batch (m micro-batches);
  // micro-batch k takes rows [k·b, (k+1)·b). Sources of one input are fed
  // in order, so one cached global batch per input suffices.
  const int64_t micro_batches = options.num_micro_batches;
  struct GlobalBatch {
    int64_t iteration = -1;
    Tensor tensor;
  };
  std::map<std::string, GlobalBatch, std::less<>> global_batches;
  std::mutex feed_mutex;
  const auto feed = [&](int64_t iteration, int64_t micro_batch, std::string_view input, const Tensor& out) -> absl::Status {
    if (input == options.optimizer.lr_input_name) {
      Tensor t = out;
      return t.CopyFrom(Tensor::FromVector(Shape{}, std::vector<float>{static_cast<float>(schedule.At(iteration))}));
    }
    if (micro_batches == 1) return model->FillBatch(iteration, input, out);
    if (out.shape().rank() == 0) return absl::InvalidArgumentError(StrCat("input '", input, "' has no batch axis to split into micro-batches"));
    std::lock_guard<std::mutex> lock(feed_mutex);
    GlobalBatch& global = global_batches[std::string(input)];
    if (global.iteration != iteration) {
      if (!global.tensor.defined()) {
        Shape shape = out.shape();
        shape[0] *= micro_batches;
        ASSIGN_OR_RETURN(global.tensor, Tensor::Zeros(shape, out.dtype()));
      }
      RETURN_IF_ERROR(model->FillBatch(iteration, input, global.tensor));
      global.iteration = iteration;
    }
    const int64_t rows = out.shape()[0];
    ASSIGN_OR_RETURN(Tensor rows_of_micro_batch, global.tensor.SliceRows(micro_batch * rows, rows));
    Tensor t = out;
    return t.CopyFrom(rows_of_micro_batch);
  };
  const auto fetch = [&](int64_t iteration, const std::map<std::string, Tensor>& values) -> absl::Status {
    const double loss = values.at("loss").ToVector<float>().at(0);
    summary.losses[static_cast<size_t>(iteration)] = loss;
    if (!std::isfinite(loss)) return absl::InternalError(StrCat("loss is ", loss, " at iteration ", iteration));
    if ((iteration + 1) % log_period != 0 && iteration + 1 != iters) return absl::OkStatus();
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_log).count();
    const double samples = static_cast<double>((iteration - last_log_iter) * batch * micro_batches);
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
