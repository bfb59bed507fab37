#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <numbers>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_join.h"
#include "comm/proto/plan_codec.h"
#include "core/config.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/text.h"
#include "data/indexed_dataset.h"
#include "fmt/format.h"
#include "models/model.h"
#include "scheduler/mesh.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/job_config.h"

namespace tessera {
namespace {

// train.train_iter's bound (the random streams count iterations in 32 bits),
// also the most runs of the evaluation plan.
constexpr int64_t kMaxIterations = (int64_t{1} << 32) - 1;

template <typename T>
void CommonOptimizerOptions(const T& c, graph::OptimizerOptions& o) {
  o.weight_decay = c.weight_decay;
  o.clip_grad_max_norm = c.clip_grad_max_norm;
  o.clip_grad_norm_type = c.clip_grad_norm_type;
  if (!c.no_decay_norm_and_bias) o.no_weight_decay_patterns.clear();
}

absl::StatusOr<graph::OptimizerOptions> OptimizerFromConfig(const nlohmann::json& optim, double* lr) {
  graph::OptimizerOptions o;
  const std::string target = optim.at("_target_").get<std::string>();
  const auto clips = [](const auto& c) -> absl::Status {
    // A norm for no clipping would be a key nothing reads.
    if (!c.clip_grad_max_norm && c.clip_grad_norm_type != 2.0) {
      return absl::InvalidArgumentError(
          StrCat("optim.clip_grad_norm_type ", c.clip_grad_norm_type,
                 " chooses the norm clipping bounds, but optim.clip_grad_max_norm is null (no clipping): set it, or "
                 "leave the norm type at 2.0"));
    }
    return absl::OkStatus();
  };
  if (target == "AdamW") {
    ASSIGN_OR_RETURN(const AdamWConfig c, AdamWKeys().Read(optim));
    RETURN_IF_ERROR(clips(c));
    o.kind = graph::OptimizerKind::kAdamW;
    o.beta1 = c.betas.at(0);
    o.beta2 = c.betas.at(1);
    o.eps = c.eps;
    CommonOptimizerOptions(c, o);
    *lr = c.lr;
  } else if (target == "SGD") {
    ASSIGN_OR_RETURN(const SgdConfig c, SgdKeys().Read(optim));
    RETURN_IF_ERROR(clips(c));
    if (c.nesterov && !(c.momentum > 0)) {
      return absl::InvalidArgumentError(
          "optim.nesterov is true but optim.momentum is 0: Nesterov momentum needs momentum > 0 (as torch.optim.SGD)");
    }
    o.kind = graph::OptimizerKind::kSgd;
    o.momentum = c.momentum;
    o.nesterov = c.nesterov;
    CommonOptimizerOptions(c, o);
    *lr = c.lr;
  } else {
    return absl::InternalError(StrCat("optim._target_ '", target, "' is declared but has no optimizer"));
  }
  return o;
}

}  // namespace

namespace {

// train.dist -> the device mesh's numbers. The world is dp × tp × pp virtual
// devices; with data_parallel_size null it is train.dist.num_devices and dp
// is derived. pipeline_num_layers must be the model's layer count.
absl::StatusOr<scheduler::ParallelConfig> ParallelFromConfig(const DistConfig& dist, const models::Model& model) {
  scheduler::ParallelConfig parallel;
  parallel.tensor = dist.tensor_parallel_size;
  parallel.pipeline = dist.pipeline_parallel_size;
  if (dist.data_parallel_size) {
    parallel.data = *dist.data_parallel_size;
    // Each factor is at most kMaxDevicesPerNode, so the product fits.
    parallel.world_size = parallel.data * parallel.tensor * parallel.pipeline;
    if (dist.num_devices && *dist.num_devices != parallel.world_size) {
      return absl::InvalidArgumentError(StrCat("train.dist.num_devices ", *dist.num_devices, " != data ", parallel.data,
                                               " x tensor ", parallel.tensor, " x pipeline ", parallel.pipeline,
                                               " parallel sizes"));
    }
  } else {
    if (!dist.num_devices) {
      return absl::InvalidArgumentError("train.dist.data_parallel_size is null: set it or train.dist.num_devices");
    }
    parallel.world_size = *dist.num_devices;
  }
  if (parallel.world_size > kMaxDevicesPerNode) {
    return absl::InvalidArgumentError(StrCat("train.dist: data ", parallel.data, " x tensor ", parallel.tensor, " x pipeline ",
                                             parallel.pipeline, " = ", parallel.world_size,
                                             " devices, but one node holds at most ", kMaxDevicesPerNode));
  }
  const int64_t layers = model.num_layers();
  if (dist.pipeline_num_layers && *dist.pipeline_num_layers != layers) {
    return absl::InvalidArgumentError(StrCat("train.dist.pipeline_num_layers ", *dist.pipeline_num_layers,
                                             " != the model's ", layers, " layers (leave it null to use the model's)"));
  }
  parallel.pipeline_num_layers = layers;
  if (dist.custom_pipeline_stage_id) {
    // An empty list would read as "automatic", which null says.
    if (dist.custom_pipeline_stage_id->empty()) {
      return absl::InvalidArgumentError(
          StrCat("train.dist.custom_pipeline_stage_id is empty: give one stage per layer (", layers,
                 "), or null for LiBai's automatic assignment"));
    }
    parallel.custom_stage_of_layer = *dist.custom_pipeline_stage_id;
  }
  return parallel;
}

struct Job {
  nlohmann::json config;  // resolved
  TrainConfig train;
  int64_t batch = 0;  // per data-parallel rank and micro-batch
  int64_t data_parallel = 1;
  std::unique_ptr<models::Model> model;
  CompileOptions options;
  std::optional<LrSchedule> schedule;  // set by Prepare
  std::unique_ptr<Engine> engine;
  // The text data, when preparing the job opened it (train.train_epoch
  // counts its samples); JobFeed takes it rather than opening it again.
  std::unique_ptr<TextData> text;

  // Samples per iteration: micro-batch × data-parallel ranks × micro-batches.
  int64_t global_batch() const { return batch * data_parallel * options.num_micro_batches; }
};

// train.train_epoch: LiBai's train_iter = max(train_iter, ceil(epochs ×
// training samples / global batch)), the samples those of the text data's
// training split (opened, and built from dataloader.text_file if missing,
// as the run would). The resolved config gets the result, so config.json,
// the schedule and a cluster's nodes see it; applying it again changes
// nothing.
absl::Status ApplyEpochs(bool has_text, Job& job) {
  const int64_t epochs = job.train.train_epoch;
  if (!has_text) {
    return absl::InvalidArgumentError(
        StrCat("train.train_epoch ", epochs,
               " needs text data (dataloader.data_prefix): an epoch is a pass over its training split; without "
               "it set train.train_iter"));
  }
  ASSIGN_OR_RETURN(job.text, TextData::Open(job.config, *job.model->text_inputs()));
  const int64_t samples = job.text->train_samples(), global = job.global_batch();
  const auto needed = (static_cast<unsigned __int128>(epochs) * static_cast<uint64_t>(samples) + global - 1) /
                      static_cast<uint64_t>(global);
  if (needed > static_cast<unsigned __int128>(kMaxIterations)) {
    return absl::InvalidArgumentError(StrCat("train.train_epoch ", epochs, " over ", samples,
                                             " training samples at a global batch of ", global,
                                             " needs more than the 2^32 - 1 iterations train.train_iter allows"));
  }
  const auto iterations = static_cast<int64_t>(needed);
  if (iterations <= job.train.train_iter) {
    TLOG_DEBUG(
        "train.train_epoch {}: {} training samples at a global batch of {} take {} iterations; "
        "train.train_iter stays {}",
        epochs, samples, global, iterations, job.train.train_iter);
    return absl::OkStatus();
  }
  TLOG_INFO(
      "train.train_epoch {}: {} training samples at a global batch of {} take {} iterations; train.train_iter "
      "raised to {}",
      epochs, samples, global, iterations, iterations);
  job.train.train_iter = iterations;
  job.config["train"]["train_iter"] = iterations;
  return absl::OkStatus();
}

// Resolves the config and builds the model, the mesh, the batch arithmetic,
// the optimizer and the schedule; with `compile`, also the graph and the
// engine (job.engine is null without).
absl::StatusOr<Job> Prepare(const nlohmann::json& raw_config, PlanExecutor executor = {}, bool compile = true) {
  const auto started = std::chrono::steady_clock::now();
  Job job;
  ASSIGN_OR_RETURN(job.config, ResolveJobConfig(raw_config));
  ASSIGN_OR_RETURN(job.train, TrainKeys().Read(job.config.at("train")));
  const TrainConfig& train = job.train;
  job.options.executor = std::move(executor);
  job.batch = train.train_micro_batch_size;
  Registry<models::Model> registry("model");
  RETURN_IF_ERROR(models::RegisterBuiltinModels(registry));
  ASSIGN_OR_RETURN(job.model, registry.Create(job.config.at("model")));
  // What the text data keys ask must fit the model (the files are checked
  // when the data is opened, JobFeed::Make).
  const bool has_text = !job.config.at("dataloader").at("data_prefix").is_null();
  if (has_text && !job.model->text_inputs()) {
    return absl::InvalidArgumentError(StrCat("dataloader.data_prefix: ",
                                             job.config.at("model").at("_target_").get<std::string>(),
                                             " reads no text data (leave it null)"));
  }
  if (!has_text && job.model->text_inputs() &&
      job.model->text_inputs()->kind == models::Model::TextInputs::Kind::kBert) {
    return absl::InvalidArgumentError(
        "dataloader.data_prefix: models.BERT trains on text only (set it, with tokenization.tokenizer=bert)");
  }
  if (!has_text && !job.config.at("dataloader").at("text_file").is_null()) {
    // (Whatever the model: one without text read it nowhere.)
    return absl::InvalidArgumentError(
        "dataloader.text_file needs dataloader.data_prefix (where the dataset is written)");
  }
  if (!has_text && !job.config.at("tokenization").at("tokenizer").is_null()) {
    return absl::InvalidArgumentError(
        "tokenization.tokenizer: the job has no text data to tokenize (dataloader.data_prefix is null)");
  }
  if (!has_text && train.evaluation.enabled) {
    return absl::InvalidArgumentError("train.evaluation.enabled needs text data (dataloader.data_prefix)");
  }
  if (train.eval_only && !train.evaluation.enabled) {
    return absl::InvalidArgumentError(
        "train.eval_only evaluates, so it needs train.evaluation.enabled=true (and text data: dataloader.data_prefix)");
  }
  if (train.checkpointer.save_best && !train.evaluation.enabled) {
    return absl::InvalidArgumentError(
        "train.checkpointer.save_best keeps the best evaluation's weights, so it needs train.evaluation.enabled=true");
  }
  const EvaluationConfig defaults;
  if (!train.checkpointer.save_best &&
      (train.evaluation.eval_metric != defaults.eval_metric || train.evaluation.eval_mode != defaults.eval_mode)) {
    return absl::InvalidArgumentError(
        "train.evaluation.eval_metric and eval_mode choose the best checkpoint: set "
        "train.checkpointer.save_best=true, or leave them at eval_loss and min");
  }
  if (train.checkpointer.save_best) {
    // The metrics its evaluation reports: those of its graph's fetches.
    ASSIGN_OR_RETURN(const graph::Graph eval_graph, job.model->BuildEvalGraph(1));
    std::map<std::string, double> sums = {{"loss", 1.0}};
    for (const auto& [name, value] : eval_graph.fetches()) sums[name] = 1.0;
    const std::optional<models::Model::TextInputs> text = job.model->text_inputs();
    ASSIGN_OR_RETURN(const auto reported, EvalMetrics(sums, 1, job.model->eval_loss_terms(),
                                                      text && text->kind == models::Model::TextInputs::Kind::kGpt));
    std::vector<std::string> metrics;
    for (const auto& [name, value] : reported) metrics.push_back(name);
    if (std::find(metrics.begin(), metrics.end(), train.evaluation.eval_metric) == metrics.end()) {
      return absl::InvalidArgumentError(StrCat(
          "train.evaluation.eval_metric '", train.evaluation.eval_metric, "' is not a metric of ",
          job.config.at("model").at("_target_").get<std::string>(), "'s evaluation (", Join(metrics, ", "), ")"));
    }
  }
  ASSIGN_OR_RETURN(job.options.lower.parallel, ParallelFromConfig(train.dist, *job.model));
  job.options.lower.parallel.device_type = train.dist.device_type == "cuda" ? DeviceType::kCuda : DeviceType::kCpu;
  if (train.dist.intra_op_threads) job.options.intra_op_threads = static_cast<int>(*train.dist.intra_op_threads);
  job.options.lower.async_compute = train.dist.async_compute;

  job.options.gradient_bucket_bytes = static_cast<int64_t>(train.dist.gradient_bucket_mb * (1 << 20));
  ASSIGN_OR_RETURN(const scheduler::DeviceMesh mesh, scheduler::DeviceMesh::Make(job.options.lower.parallel));
  job.data_parallel = mesh.data_parallel_size();
  // global = micro × accumulation × data-parallel ranks: any two of micro,
  // accumulation and global give the third.
  const int64_t per_step = job.batch * job.data_parallel;
  std::optional<int64_t> accumulation = train.num_accumulation_steps;
  const std::optional<int64_t> global = train.global_batch_size;
  if (!accumulation) {
    if (global && *global % per_step != 0) {
      return absl::InvalidArgumentError(StrCat("train.global_batch_size ", *global,
                                               " is not a multiple of train.train_micro_batch_size ", job.batch, " x ",
                                               job.data_parallel, " data-parallel ranks"));
    }
    accumulation = global ? *global / per_step : 1;
    // (Derived, it is held to the key's own bound: 67108864 micro-batches
    // planned for 43 s before anything said no.)
    if (*accumulation > kMaxMicroBatches) {
      return absl::InvalidArgumentError(StrCat("train.global_batch_size ", *global, " is ", *accumulation,
                                               " micro-batches of train.train_micro_batch_size ", job.batch, " x ",
                                               job.data_parallel, " data-parallel ranks, more than the ",
                                               kMaxMicroBatches, " train.num_accumulation_steps allows"));
    }
  }
  if (global && *global != per_step * *accumulation) {
    return absl::InvalidArgumentError(StrCat("train.global_batch_size ", *global, " != train.train_micro_batch_size ",
                                             job.batch, " x train.num_accumulation_steps ", *accumulation, " x ",
                                             job.data_parallel, " data-parallel ranks"));
  }
  // The samples of an iteration, however given, within global_batch_size's
  // range (the scheduler's arithmetic on them stays far from overflow).
  constexpr int64_t kMaxGlobalBatch = std::numeric_limits<int32_t>::max();
  if (int64_t samples = 0; __builtin_mul_overflow(per_step, *accumulation, &samples) || samples > kMaxGlobalBatch) {
    return absl::InvalidArgumentError(StrCat("train.train_micro_batch_size ", job.batch,
                                             " x train.num_accumulation_steps ", *accumulation, " x ",
                                             job.data_parallel, " data-parallel ranks is more than ", kMaxGlobalBatch,
                                             " samples an iteration (train.global_batch_size's bound)"));
  }
  job.options.num_micro_batches = *accumulation;
  job.options.activation_checkpoint = train.activation_checkpoint.enabled;
  job.options.lower.zero_stage =
      train.zero_optimization.enabled ? static_cast<int>(train.zero_optimization.stage) : 0;
  if (train.amp.enabled) {
    job.options.amp = train.amp.dtype == "fp16" ? DType::kF16 : DType::kBF16;
    job.options.loss_scale = {.initial_scale = train.amp.initial_loss_scale,
                              .growth_interval = train.amp.loss_scale_growth_interval};
  }
  if (train.train_epoch > 0) RETURN_IF_ERROR(ApplyEpochs(has_text, job));
  // The graph is built for the logical micro-batch: every data-parallel
  // rank's samples (the scheduler splits it).
  double base_lr = 0;
  ASSIGN_OR_RETURN(job.options.optimizer, OptimizerFromConfig(job.config.at("optim"), &base_lr));
  ASSIGN_OR_RETURN(job.schedule,
                   MakeLrSchedule(job.config.at("lr_scheduler"), base_lr, train.train_iter, train.warmup_ratio));
  if (!compile) return job;
  ASSIGN_OR_RETURN(graph::Graph graph, job.model->BuildGraph(per_step));
  const int64_t logical_nodes = graph.num_nodes();
  ASSIGN_OR_RETURN(job.engine, Engine::Compile(std::move(graph), job.options));
  TLOG_INFO("compiled {}: {} graph nodes, {} after autodiff and the optimizer, in {:.1f} ms",
            job.config.at("model").at("_target_").get<std::string>(), logical_nodes, job.engine->graph().num_nodes(),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  return job;
}
}  // namespace

// Every tensor `plan` keeps must be in the run start's checkpoint with its
// shape (a resume's or an evaluation's: all of the checkpoint's, its
// optimizer and model); checked before any worker starts, and by `tessera
// plan --resume`. OK when the run starts from scratch.
namespace {
absl::Status CheckRunStartFitsPlan(Job& job, const proto::Plan& plan, const RunStart& start) {
  if (start.checkpoint.empty()) return absl::OkStatus();
  // Every tensor the plan keeps must be in the checkpoint with its shape:
  // checked here, before any worker starts.
  ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(start.checkpoint, job.model->HuggingFaceTensors()));
  // A resume continues the optimizer's state: another optimizer has none
  // of it (its tensors' names would be all the error said).
  if (!start.weights_only && !job.train.eval_only && reader->config().is_object() &&
      reader->config().contains("optim") && reader->config()["optim"].is_object()) {
    const nlohmann::json was = reader->config()["optim"].value("_target_", nlohmann::json());
    const nlohmann::json is = job.config.at("optim").value("_target_", nlohmann::json());
    if (!was.is_null() && was != is) {
      return absl::InvalidArgumentError(StrCat("checkpoint ", start.checkpoint, " was trained with optim._target_ ",
                                               was.dump(), ", this run has ", is.dump(),
                                               ": a resume continues the optimizer's state (start a new run from "
                                               "its weights with train.load_weight instead)"));
    }
  }
  actors::HostCallbacks probe;
  RETURN_IF_ERROR(BindCheckpointInitializers(plan, reader, start.weights_only, job.engine->graph().registry(), probe));
  // A resume or an evaluation claims the checkpoint's model: the same
  // attention heads too (they change no tensor's shape, so the checks of
  // the tensors below do not see them), and the same initialisation seed
  // where train.seed is the same (nothing reads another: every weight
  // comes from the checkpoint; another train.seed derives another one,
  // reseeding dropout and the data order, which is read).
  if (!start.weights_only || job.train.eval_only) {
    const nlohmann::json& saved = reader->config();
    if (saved.is_object() && saved.contains("model") && saved["model"].is_object()) {
      const bool same_train_seed = saved.contains("train") && saved["train"].is_object() &&
                                   saved["train"].value("seed", nlohmann::json()) == job.config.at("train").at("seed");
      // (The init's spread too: another one, with every weight from the
      // checkpoint, would be read by nothing.)
      for (const char* key : {"_target_", "num_attention_heads", "init_seed", "initializer_range",
                              "use_scaled_init_for_output_weights"}) {
        if (std::string_view(key) == "init_seed" && !same_train_seed) continue;
        const nlohmann::json& was = saved["model"].contains(key) ? saved["model"][key] : nlohmann::json();
        const nlohmann::json& is =
            job.config.at("model").contains(key) ? job.config.at("model")[key] : nlohmann::json();
        if (!was.is_null() && was != is) {
          return absl::InvalidArgumentError(StrCat("checkpoint ", start.checkpoint, " was trained with model.", key,
                                                   " ", was.dump(), ", this run has ", is.dump()));
        }
      }
    }
  }
  // A resume or an evaluation claims the checkpoint's model: all of it.
  // A new run from weights may start from part of them (transformers
  // warns "some weights were not used", as here).
  if (absl::Status whole = CheckCheckpointHoldsNothingMore(plan, *reader, start.weights_only); !whole.ok()) {
    if (!start.weights_only || job.train.eval_only) return whole;
    TLOG_WARN("train.load_weight: {}; the run starts from the rest", std::string(whole.message()));
  }
  return absl::OkStatus();
}

// The plan of the job's evaluation (train.evaluation): the model's
// evaluation graph at one training micro-batch (every data-parallel rank's
// rows), forward only, on the same mesh, its variables with the training
// plan's layouts and callbacks; lowered for one run (the runner sets each
// evaluation's batches).
absl::StatusOr<proto::Plan> LowerEvaluationPlan(const Job& job, const std::vector<uint32_t>& devices_per_node) {
  ASSIGN_OR_RETURN(graph::Graph eval_graph, job.model->BuildEvalGraph(job.batch * job.data_parallel));
  CompileOptions eval_options = job.options;
  eval_options.train = false;
  eval_options.num_micro_batches = 1;
  eval_options.activation_checkpoint = false;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> eval_engine, Engine::Compile(std::move(eval_graph), eval_options));
  scheduler::LowerOptions eval_lower = eval_options.lower;
  eval_lower.devices_per_node = devices_per_node;
  eval_lower.iterations = 1;
  ASSIGN_OR_RETURN(scheduler::LoweredPlan lowered, scheduler::LowerToPlan(eval_engine->graph(), eval_lower));
  return std::move(lowered.plan);
}

absl::StatusOr<JobPlans> PlanJob(const nlohmann::json& config, bool with_evaluation) {
  ASSIGN_OR_RETURN(Job job, Prepare(config));
  // Where a run would start (a resume's or load_weight's checkpoint) is
  // checked as a run checks it; a plan writes nothing, so an earlier run's
  // checkpoints in output_dir are no reason to refuse one: what a run
  // refuses only because it would write is said, the plan is still the
  // plan (the checks without writing run only then).
  JobPlans plans;
  absl::StatusOr<RunStart> start =
      ResolveRunStart(job.train, job.config, job.global_batch(), job.model->HuggingFaceTensors());
  if (!start.ok()) {
    plans.warnings.push_back(StrCat("`tessera train` would refuse this run: ", start.status().message()));
    start = ResolveRunStart(job.train, job.config, job.global_batch(), job.model->HuggingFaceTensors(),
                            /*for_writing=*/false);
    RETURN_IF_ERROR(start.status());
  }
  // The outputs' directory as a run checks it (a file there, or one that
  // cannot be written, was planned without a word): an evaluation-only job
  // writes nothing.
  if (!job.train.eval_only && !job.train.output_dir.empty()) {
    RETURN_IF_ERROR(CheckOutputDir(job.train.output_dir));
    RETURN_IF_ERROR(CheckOutputDir(CheckpointsDir(job.train.output_dir)));
  }
  ASSIGN_OR_RETURN(plans.training, job.engine->Plan(job.train.train_iter));
  // (Its tensors' names, shapes and types, from the index: the data only
  // train reads.)
  RETURN_IF_ERROR(CheckRunStartFitsPlan(job, plans.training, *start));
  // The data as a run opens it (the dataset and its splits, the tokenizer,
  // eval_iter against the valid split), building nothing and reading no
  // token (a run checks every id).
  RETURN_IF_ERROR(JobFeed::Make(job.config, /*plan_only=*/true).status());
  if (with_evaluation && job.train.evaluation.enabled) {
    ASSIGN_OR_RETURN(plans.evaluation, LowerEvaluationPlan(job, job.options.lower.devices_per_node));
    plans.evaluation_only = job.train.eval_only;
  }
  // (Said only on stderr: `--format json` held no word of it.)
  if (!plans.training.memory_note().empty()) {
    plans.warnings.push_back(StrCat("memory plan: ", plans.training.memory_note()));
  }
  if (plans.evaluation && !plans.evaluation->memory_note().empty()) {
    plans.warnings.push_back(StrCat("evaluation memory plan: ", plans.evaluation->memory_note()));
  }
  return plans;
}

}  // namespace

absl::StatusOr<proto::Plan> TrainingPlan(const nlohmann::json& config) {
  ASSIGN_OR_RETURN(JobPlans plans, PlanJob(config, /*with_evaluation=*/false));
  return std::move(plans.training);
}

absl::StatusOr<JobPlans> TrainingPlans(const nlohmann::json& config) {
  return PlanJob(config, /*with_evaluation=*/true);
}

std::string FormatProgressLine(int64_t iteration, int64_t iterations, const nlohmann::json& metrics) {
  const auto number = [&](const char* key) { return metrics.contains(key) ? metrics.at(key).get<double>() : 0.0; };
  // (As `tessera train`'s lines, train/progress.h: grad_norm only where
  // clipping fetches it.)
  const std::string grad_norm = metrics.contains("grad_norm") && metrics.at("grad_norm").is_number()
                                    ? fmt::format("  grad_norm {:.4g}", metrics.at("grad_norm").get<double>())
                                    : std::string();
  return fmt::format("iter {}/{}  loss {:.6f}  lr {:.4g}{}  samples/s {:.0f}\n", iteration, iterations, number("loss"),
                     number("lr"), grad_norm, number("samples_per_s"));
}

absl::Status CheckOutputDir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::path probe = dir;
  while (!probe.empty() && !std::filesystem::exists(probe, ec)) {
    const std::filesystem::path parent = probe.parent_path();
    if (parent == probe) break;
    probe = parent;
  }
  if (probe.empty()) probe = ".";
  if (!std::filesystem::is_directory(probe, ec)) {
    return absl::InvalidArgumentError(StrCat("train.output_dir '", dir.string(), "': '", probe.string(), "' is not a directory"));
  }
  if (::access(probe.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(StrCat("train.output_dir '", dir.string(), "': cannot write into '", probe.string(), "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<JobFeed>> JobFeed::Make(const nlohmann::json& config, bool plan_only) {
  std::unique_ptr<JobFeed> out(new JobFeed);
  // The data needs the model and the schedule, not the compiled graph.
  ASSIGN_OR_RETURN(Job job, Prepare(config, {}, /*compile=*/false));
  out->model_ = std::move(job.model);
  out->schedule_ = job.schedule;
  out->micro_batches_ = job.options.num_micro_batches;
  out->lr_input_ = job.options.optimizer.lr_input_name;
  out->global_batch_ = job.global_batch();
  out->iterations_ = job.train.train_iter;
  out->log_period_ = job.train.log_period;
  out->devices_ = job.options.lower.parallel.world_size;
  out->intra_op_threads_ = job.options.intra_op_threads;
  out->config_ = job.config;
  out->train_ = job.train;
  out->hf_layout_ = out->model_->HuggingFaceTensors();
  const std::optional<models::Model::TextInputs> text_inputs = out->model_->text_inputs();
  if (text_inputs) {
    out->tokens_per_sample_ = text_inputs->seq_length;
    out->reports_perplexity_ = text_inputs->kind == models::Model::TextInputs::Kind::kGpt;
    if (job.text != nullptr) {
      out->text_ = std::move(job.text);
    } else {
      ASSIGN_OR_RETURN(out->text_, TextData::Open(job.config, *text_inputs, nullptr, plan_only));
    }
  }
  // (Not built yet: what it holds is checked when the run builds it.)
  if (text_inputs && out->text_ == nullptr && plan_only) return out;
  if (job.train.evaluation.enabled) {
    if (out->text_->valid_samples() == 0) {
      return absl::InvalidArgumentError(StrCat("train.evaluation.enabled: the valid split of dataloader.splits '",
                                               job.config.at("dataloader").at("splits").get<std::string>(),
                                               "' holds no whole sample (GPT: a window of model.seq_length + 1 "
                                               "tokens; BERT: two documents with sentences)"));
    }
    // Evaluation batches are global batches, so every layout of the same
    // global batch evaluates the same samples: each is fed as its
    // accumulation steps' micro-batches (every data-parallel rank's rows),
    // one run of the evaluation plan each. The whole split is covered by
    // as many micro-batches as it takes, the last one padded with samples of
    // weight 0, so each sample counts once and the result does not depend
    // on the global batch either.
    const int64_t rows = out->global_batch_;
    const int64_t micro_rows = rows / out->micro_batches_;
    const int64_t n = out->text_->valid_samples();
    const int64_t whole = (n + rows - 1) / rows;
    const int64_t batches = job.train.evaluation.eval_iter.value_or(whole);
    if (batches > whole) {
      return absl::InvalidArgumentError(StrCat("train.evaluation.eval_iter ", batches, " is more than the ", whole,
                                               " global batches of ", rows, " that the valid split's ", n,
                                               " samples make (null: the whole split)"));
    }
    if (batches > kMaxIterations / out->micro_batches_) {
      return absl::InvalidArgumentError(
          StrCat(job.train.evaluation.eval_iter ? "train.evaluation.eval_iter " : "train.evaluation: ", batches,
                 " global batches × ", out->micro_batches_,
                 " micro-batches each is more than the 2^32 - 1 runs of the evaluation plan allowed"));
    }
    // eval_iter's last batch may reach past the split's end (the most it
    // allows is the `whole` that null evaluates): padded too, never wrapped
    // round to count samples twice.
    out->eval_samples_ = std::min(batches * rows, n);
    out->eval_batches_ = (out->eval_samples_ + micro_rows - 1) / micro_rows;
    out->eval_loss_terms_ = out->model_->eval_loss_terms();
  }
  return out;
}

// The model fills the iteration's global batch (m micro-batches); micro-batch
// k takes rows [k·b, (k+1)·b). Sources of one input are fed in order, so one
// cached global batch per input suffices.
absl::Status JobFeed::Fill(int64_t iteration, int64_t micro_batch, std::string_view input, const Tensor& out) {
  if (input == lr_input_) {
    Tensor t = out;
    return t.CopyFrom(Tensor::FromVector(Shape{}, std::vector<float>{static_cast<float>(schedule_->At(iteration))}));
  }
  const auto fill = [&](const Tensor& rows) {
    return text_ != nullptr ? text_->FillTrain(iteration, input, rows) : model_->FillBatch(iteration, input, rows);
  };
  if (micro_batches_ == 1) return fill(out);
  if (out.shape().rank() == 0) {
    return absl::InvalidArgumentError(StrCat("input '", input, "' has no batch axis to split into micro-batches"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  GlobalBatch& global = global_batches_[std::string(input)];
  if (global.iteration != iteration) {
    if (!global.tensor.defined()) {
      Shape shape = out.shape();
      shape[0] *= micro_batches_;
      ASSIGN_OR_RETURN(global.tensor, Tensor::Zeros(shape, out.dtype()));
    }
    RETURN_IF_ERROR(fill(global.tensor));
    global.iteration = iteration;
  }
  const int64_t rows = out.shape()[0];
  ASSIGN_OR_RETURN(Tensor rows_of_micro_batch, global.tensor.SliceRows(micro_batch * rows, rows));
  Tensor t = out;
  return t.CopyFrom(rows_of_micro_batch);
}

absl::StatusOr<std::map<std::string, double>> EvalMetrics(const std::map<std::string, double>& sums, int64_t runs,
                                                          const std::vector<std::string>& loss_terms, bool perplexity) {
  if (runs < 1) return absl::InvalidArgumentError(StrCat("evaluation: runs must be >= 1, got ", runs));
  std::map<std::string, double> metrics;
  const auto stem = [](const std::string& name, std::string_view suffix) -> std::optional<std::string> {
    if (name.size() <= suffix.size() || !name.ends_with(suffix)) return std::nullopt;
    return name.substr(0, name.size() - suffix.size());
  };
  std::set<std::string> paired;  // names taken by a pair
  for (const auto& [name, sum] : sums) {
    for (const auto& [numerator, denominator, prefix_suffix] :
         {std::tuple{"_sum", "_weight", ""}, std::tuple{"_correct", "_count", "_accuracy"}}) {
      const std::optional<std::string> m = stem(name, numerator);
      if (!m) continue;
      const auto weight = sums.find(*m + denominator);
      if (weight == sums.end()) continue;
      // A loss pair stands for its plain fetch too (the unweighted mean).
      paired.insert({name, weight->first, std::string(prefix_suffix).empty() ? *m : name});
      if (weight->second > 0) metrics[StrCat("eval_", *m, prefix_suffix)] = sum / weight->second;
    }
  }
  for (const auto& [name, sum] : sums) {
    if (!paired.contains(name) && runs > 0) metrics["eval_" + name] = sum / static_cast<double>(runs);
  }
  double loss = 0;
  for (const std::string& term : loss_terms) {
    const auto value = metrics.find("eval_" + term);
    if (value == metrics.end()) {
      return absl::InternalError(StrCat("evaluation: the model's loss term '", term, "' was not fetched"));
    }
    loss += value->second;
  }
  metrics["eval_loss"] = loss;
  if (perplexity) metrics["eval_ppl"] = std::exp(loss);
  return metrics;
}

namespace {

// A resume's dataloader.splits against its checkpoint's: refused when they
// give the training split other documents of the dataset (the position the
// checkpoint counted would be another text's); other weights that cut the
// same training split (8,2,0 for 80,20,0; another valid/test cut) resume.
absl::Status CheckResumedTrainingSplit(const nlohmann::json& checkpoint_config, const nlohmann::json& config,
                                       const std::string& checkpoint) {
  const auto loader_key = [](const nlohmann::json& resolved, const char* name) -> const nlohmann::json* {
    const auto loader = resolved.is_object() ? resolved.find("dataloader") : resolved.end();
    if (loader == resolved.end() || !loader->is_object()) return nullptr;
    const auto value = loader->find(name);
    return value == loader->end() || !value->is_string() ? nullptr : &*value;
  };
  const nlohmann::json* before = loader_key(checkpoint_config, "splits");
  const nlohmann::json* now = loader_key(config, "splits");
  const nlohmann::json* prefix = loader_key(config, "data_prefix");
  if (before == nullptr || now == nullptr || prefix == nullptr || *before == *now) return absl::OkStatus();
  // (A dataset that does not open is the data's own error to name.)
  const auto dataset = data::IndexedDataset::Open(ExpandPath(prefix->get<std::string>()));
  if (!dataset.ok()) return absl::OkStatus();
  const int64_t documents = (*dataset)->num_documents();
  const auto was = data::SplitDocuments(before->get<std::string>(), documents, data::DatasetSplit::kTrain);
  const auto is = data::SplitDocuments(now->get<std::string>(), documents, data::DatasetSplit::kTrain);
  if (!was.ok() || !is.ok() || (was->begin == is->begin && was->end == is->end)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat("train.resume: the latest checkpoint, ", checkpoint, ", trained on documents [", was->begin, ", ",
             was->end, ") of the dataset (dataloader.splits ", before->dump(), "), this run's splits ", now->dump(),
             " make the training split [", is->begin, ", ", is->end,
             "): resume with the same training split, or start from its weights with train.load_weight"));
}

}  // namespace

absl::StatusOr<RunStart> ResolveRunStart(const TrainConfig& train, const nlohmann::json& config, int64_t global_batch,
                                         const std::vector<models::Model::HfTensor>& hf_layout, bool for_writing) {
  RunStart start;
  if (train.overwrite_output_dir && (train.resume || train.eval_only)) {
    return absl::InvalidArgumentError(
        StrCat("train.overwrite_output_dir removes the checkpoints in train.output_dir that ",
               train.resume ? "train.resume continues from" : "train.eval_only evaluates", ": set one of them"));
  }
  if (train.eval_only) {
    // The weights alone, at the iteration they were trained to.
    std::string source = train.load_weight.value_or("");
    if (source.empty()) {
      ASSIGN_OR_RETURN(const std::optional<std::filesystem::path> latest, LatestCheckpoint(train.output_dir));
      if (!latest) {
        return absl::InvalidArgumentError(StrCat("train.eval_only evaluates saved weights: train.output_dir '",
                                                 train.output_dir,
                                                 "' holds no checkpoint, and train.load_weight is not set"));
      }
      source = latest->string();
    }
    auto reader = CheckpointReader::Open(source, hf_layout);
    if (!reader.ok()) {
      return absl::Status(
          reader.status().code(),
          StrCat(train.load_weight ? "train.load_weight: " : "train.eval_only: ", reader.status().message()));
    }
    start.iteration = (*reader)->iteration();
    start.checkpoint = source;
    start.weights_only = true;
    return start;
  }
  if (train.resume) {
    ASSIGN_OR_RETURN(const std::optional<std::filesystem::path> latest, LatestCheckpoint(train.output_dir));
    if (latest) {
      ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(*latest));
      // (A run stopped during its final evaluation: the resume runs that
      // evaluation, and trains nothing.)
      const bool final_evaluation =
          reader->iteration() == train.train_iter && reader->evaluation_pending() && train.evaluation.enabled;
      if (reader->iteration() >= train.train_iter && !final_evaluation) {
        return absl::InvalidArgumentError(
            StrCat("train.resume: the latest checkpoint, ", latest->string(), ", has trained ", reader->iteration(),
                   " iterations already, train.train_iter is ", train.train_iter, " (raise it to train further",
                   reader->evaluation_pending() ? "; its evaluation, cut short, --eval-only runs" : "", ")"));
      }
      if (reader->consumed_samples() != reader->iteration() * global_batch) {
        return absl::InvalidArgumentError(StrCat(
            "train.resume: the latest checkpoint, ", latest->string(), ", trained with a global batch of ",
            reader->iteration() > 0 ? reader->consumed_samples() / reader->iteration() : 0, ", this run's is ",
            global_batch, " (train_micro_batch_size × num_accumulation_steps × data_parallel_size): resume with the "
            "same global batch, or start from its weights with train.load_weight"));
      }
      // A key of a resolved config (null where it has none: another model's).
      const auto key = [](const nlohmann::json& resolved, const char* section, const char* name) {
        const auto part = resolved.is_object() ? resolved.find(section) : resolved.end();
        if (part == resolved.end() || !part->is_object()) return nlohmann::json();
        const auto value = part->find(name);
        return value == part->end() ? nlohmann::json() : *value;
      };
      // (Another sequence length cuts the documents into other samples: the
      // position the checkpoint counted would be another text's.)
      const nlohmann::json before = key(reader->config(), "model", "seq_length"),
                           now = key(config, "model", "seq_length");
      if (before.is_number_integer() && now.is_number_integer() && before != now) {
        return absl::InvalidArgumentError(StrCat(
            "train.resume: the latest checkpoint, ", latest->string(), ", trained with model.seq_length ",
            before.get<int64_t>(), ", this run's is ", now.get<int64_t>(),
            " (its samples are windows of that many tokens): resume with the same, or start from its weights with "
            "train.load_weight"));
      }
      // So do splits that give the training split other documents.
      RETURN_IF_ERROR(CheckResumedTrainingSplit(reader->config(), config, latest->string()));
      // Seeds and the synthetic task may change on purpose (a run past a
      // loss spike on other samples), but the run is then no longer the one
      // the checkpoint's would have been: said.
      std::vector<std::string> changed;
      for (const auto& [section, name] :
           {std::pair{"train", "seed"}, std::pair{"dataloader", "seed"}, std::pair{"model", "data_seed"},
            std::pair{"model", "dropout_seed"}, std::pair{"model", "markov_successors"},
            std::pair{"model", "masked_lm_prob"}}) {
        const nlohmann::json before = key(reader->config(), section, name), now = key(config, section, name);
        if (!before.is_null() && !now.is_null() && before != now) {
          changed.push_back(StrCat(section, ".", name, " ", before.dump(), " -> ", now.dump()));
        }
      }
      if (!changed.empty()) {
        start.warnings.push_back(
            StrCat("train.resume: ", absl::StrJoin(changed, ", "), " since the checkpoint ", latest->string(),
                   ": from iteration ", reader->iteration(),
                   " on the run draws other samples or random numbers than the checkpoint's run would have"));
      }
      start.iteration = reader->iteration();
      start.checkpoint = latest->string();
      return start;
    }
  }
  if (train.overwrite_output_dir && train.load_weight && !train.output_dir.empty()) {
    std::error_code ec;
    const std::filesystem::path weights = std::filesystem::weakly_canonical(*train.load_weight, ec);
    const std::filesystem::path removed = std::filesystem::weakly_canonical(CheckpointsDir(train.output_dir), ec);
    if (!ec && std::mismatch(removed.begin(), removed.end(), weights.begin(), weights.end()).first == removed.end()) {
      return absl::InvalidArgumentError(StrCat("train.load_weight '", *train.load_weight,
                                               "' is among the checkpoints train.overwrite_output_dir removes: load "
                                               "it from a copy elsewhere"));
    }
  }
  // A run from scratch would write its checkpoints among an earlier run's,
  // whose higher iterations would then be "the newest": pruning removed
  // each of the new run's right after it was written, and --resume,
  // generate and export took the earlier run's weights.
  if (for_writing && !train.output_dir.empty() && !train.overwrite_output_dir) {
    const absl::StatusOr<std::optional<std::filesystem::path>> earlier = LatestCheckpoint(train.output_dir);
    // (Another error, an unreadable checkpoints/, is the writability
    // check's to name.)
    if (earlier.ok() ? earlier->has_value() : absl::IsDataLoss(earlier.status())) {
      return absl::FailedPreconditionError(
          StrCat("train.output_dir '", train.output_dir, "' holds the checkpoints of an earlier run (",
                 earlier.ok() ? StrCat("the newest: ", (*earlier)->filename().string()) : std::string("one damaged"),
                 "): --resume continues it; to start afresh, set train.overwrite_output_dir=true (it removes them), or "
                 "choose another train.output_dir"));
    }
    // Its best checkpoint alone (the periodic ones removed) is as much an
    // earlier run's: this run's first evaluation would replace it.
    std::error_code ec;
    if (earlier.ok() && std::filesystem::exists(BestCheckpointPath(train.output_dir), ec)) {
      // (A resume finds no iter_* to continue: said, since it starts from
      // scratch, which the best checkpoint refuses.)
      return absl::FailedPreconditionError(
          StrCat(train.resume ? "train.resume: no checkpoints/iter_* to continue, and " : "", "train.output_dir '",
                 train.output_dir, "' holds the best checkpoint of an earlier run (",
                 BestCheckpointPath(train.output_dir).string(), "), which a run from scratch would replace: ",
                 train.resume ? "start from its weights elsewhere with train.load_weight, " : "",
                 "move it elsewhere, set train.overwrite_output_dir=true (it removes it), or choose another "
                 "train.output_dir"));
    }
  }
  if (train.load_weight) {
    auto reader = CheckpointReader::Open(*train.load_weight, hf_layout);
    if (!reader.ok())
      return absl::Status(reader.status().code(), StrCat("train.load_weight: ", reader.status().message()));
    start.checkpoint = *train.load_weight;
    start.weights_only = true;
  }
  return start;
}

absl::Status JobFeed::FillEval(int64_t batch, std::string_view input, const Tensor& out) const {
  if (text_ == nullptr) return absl::FailedPreconditionError("evaluation needs text data");
  const int64_t rows = out.shape().rank() > 0 ? out.shape()[0] : 0;
  if (input == models::kSampleWeights) {
    if (out.dtype() != DType::kF32 || out.shape().rank() != 1) {
      return absl::InvalidArgumentError(
          StrCat("evaluation input '", input, "' must be f32 (batch,), got ", out.meta().ToString()));
    }
    for (int64_t r = 0; r < rows; ++r) out.data<float>()[r] = batch * rows + r < eval_samples_ ? 1.0f : 0.0f;
    return absl::OkStatus();
  }
  return text_->FillEval(batch * rows, input, out);
}

absl::StatusOr<std::vector<proto::NodePlan>> CompileForNodes(const nlohmann::json& config,
                                                             const std::vector<uint32_t>& devices_per_node) {
  ASSIGN_OR_RETURN(Job job, Prepare(config));
  int64_t devices = 0;
  for (uint32_t n : devices_per_node) devices += n;
  if (devices != job.options.lower.parallel.world_size) {
    return absl::InvalidArgumentError(StrCat("the job needs ", job.options.lower.parallel.world_size,
                                             " devices (train.dist), the nodes give ", devices));
  }
  ASSIGN_OR_RETURN(const RunStart start,
                   ResolveRunStart(job.train, job.config, job.global_batch(), job.model->HuggingFaceTensors()));
  for (const std::string& warning : start.warnings) TLOG_WARN("{}", warning);
  scheduler::LowerOptions lower = job.options.lower;
  lower.devices_per_node = devices_per_node;
  lower.start_iteration = start.iteration;
  // An evaluation-only job runs no training iteration; its plan is lowered
  // for one (the checks and the node split are the training plan's).
  // So is a resume that only runs the final evaluation its checkpoint
  // missed (none left: its plan says 0 iterations).
  const int64_t remaining = job.train.train_iter - start.iteration;
  lower.iterations = job.train.eval_only || remaining == 0 ? 1 : remaining;
  ASSIGN_OR_RETURN(scheduler::LoweredPlan lowered, scheduler::LowerToPlan(job.engine->graph(), lower));
  if (!job.train.eval_only && remaining == 0) lowered.plan.set_iterations(0);
  RETURN_IF_ERROR(CheckRunStartFitsPlan(job, lowered.plan, start));
  ASSIGN_OR_RETURN(std::vector<proto::NodePlan> parts, comm::SplitPlan(lowered.plan));
  const std::string resolved = job.config.dump();
  for (proto::NodePlan& part : parts) {
    part.set_job_config(resolved);
    part.set_init_checkpoint(start.checkpoint);
    part.set_init_weights_only(start.weights_only);
  }
  if (job.train.evaluation.enabled) {
    ASSIGN_OR_RETURN(proto::Plan eval_plan, LowerEvaluationPlan(job, devices_per_node));
    ASSIGN_OR_RETURN(std::vector<proto::NodePlan> eval_parts, comm::SplitPlan(eval_plan));
    if (eval_parts.size() != parts.size()) {
      return absl::InternalError(StrCat("the evaluation plan spans ", eval_parts.size(), " nodes, training ", parts.size()));
    }
    for (size_t n = 0; n < parts.size(); ++n) *parts[n].mutable_eval() = std::move(eval_parts[n]);
  }
  return parts;
}

absl::StatusOr<TrainSummary> Train(const nlohmann::json& config, std::FILE* progress, PlanExecutor executor) {
  ASSIGN_OR_RETURN(Job job, Prepare(config, std::move(executor)));
  // Checkpoints and evaluation are the job runner's (cluster/engine_job.h),
  // behind `tessera train` and the cluster: asked of this call, they are
  // refused rather than skipped.
  const char* runner_only = job.train.checkpointer.period ? "train.checkpointer.period"
                            : job.train.resume            ? "train.resume"
                            : job.train.load_weight       ? "train.load_weight"
                            : job.train.evaluation.enabled ? "train.evaluation.enabled"
                                                           : nullptr;
  if (runner_only != nullptr) {
    return absl::InvalidArgumentError(StrCat(runner_only, ": checkpoints and evaluation are done by `tessera train` and "
                                             "the cluster's job runner, not by the in-process tessera::Train"));
  }
  const int64_t iters = job.train.train_iter, log_period = job.train.log_period, batch = job.batch * job.data_parallel;
  const std::filesystem::path dir(job.train.output_dir);
  RETURN_IF_ERROR(CheckOutputDir(dir));
  const CompileOptions& options = job.options;
  const LrSchedule& schedule = *job.schedule;
  Engine* engine = job.engine.get();
  // The outputs are written once the first iteration has trained, so a job
  // that fails to start leaves no output directory or half-written file.
  std::ofstream metrics;
  const auto open_outputs = [&]() -> absl::Status {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::InternalError(StrCat("cannot create train.output_dir '", dir.string(), "': ", ec.message()));
    RETURN_IF_ERROR(config::SaveConfig(job.config, dir / "config.json"));
    metrics.open(dir / "metrics.jsonl", std::ios::trunc);
    if (!metrics) return absl::InternalError(StrCat("cannot write ", (dir / "metrics.jsonl").string()));
    return absl::OkStatus();
  };

  TrainSummary summary;
  summary.losses.reserve(static_cast<size_t>(std::min<int64_t>(iters, TrainSummary::kMaxRecordedLosses)));
  auto last_log = std::chrono::steady_clock::now();
  int64_t last_log_iter = -1;
  int64_t skipped_steps = 0;  // fp16 loss scaling: steps skipped so far
  ASSIGN_OR_RETURN(std::unique_ptr<JobFeed> job_feed, JobFeed::Make(job.config));
  const FeedFn feed = job_feed->feed();
  const int64_t micro_batches = options.num_micro_batches;
  const auto fetch = [&](int64_t iteration, const std::map<std::string, Tensor>& values) -> absl::Status {
    const double loss = values.at("loss").ToVector<float>().at(0);
    if (summary.iterations == 0) RETURN_IF_ERROR(open_outputs());
    if (summary.losses.size() < static_cast<size_t>(TrainSummary::kMaxRecordedLosses)) summary.losses.push_back(loss);
    summary.iterations = iteration + 1;
    summary.final_loss = loss;
    // (Iterations counted from 1, as the progress lines and metrics.jsonl.)
    if (!std::isfinite(loss)) return absl::InternalError(StrCat("loss is ", loss, " at iteration ", iteration + 1));
    if (auto it = values.find("skipped"); it != values.end()) skipped_steps += it->second.ToVector<float>().at(0) != 0;
    if ((iteration + 1) % log_period != 0 && iteration + 1 != iters) return absl::OkStatus();
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_log).count();
    const double samples = static_cast<double>((iteration - last_log_iter) * batch * micro_batches);
    last_log = now;
    last_log_iter = iteration;
    // What a cluster node reports (cluster/engine_job.cc): grad_norm only
    // where the plan fetches it.
    nlohmann::json line = {{"iter", iteration + 1}, {"loss", loss}, {"lr", schedule.At(iteration)},
                           {"samples_per_s", seconds > 0 ? samples / seconds : 0.0}};
    for (const char* name : {"grad_norm", "loss_scale", "skipped"}) {
      if (auto it = values.find(name); it != values.end()) line[name] = it->second.ToVector<float>().at(0);
    }
    if (line.contains("skipped")) line["skipped_steps"] = skipped_steps;
    metrics << line.dump() << "\n";
    metrics.flush();
    if (progress != nullptr) {
      std::fputs(FormatProgressLine(iteration + 1, iters, line).c_str(), progress);
      std::fflush(progress);
    }
    return absl::OkStatus();
  };
  // No other run writes the directory meanwhile (made now if missing,
  // removed again if this run fails before its first output).
  DirectoryClaim claim;
  if (!dir.empty()) {
    absl::StatusOr<DirectoryClaim> claimed = DirectoryClaim::Acquire(dir);
    if (!claimed.ok())
      return absl::Status(claimed.status().code(), StrCat("train.output_dir: ", claimed.status().message()));
    claim = *std::move(claimed);
  }
  const auto started = std::chrono::steady_clock::now();
  const absl::Status ran = engine->Run(iters, feed, fetch);
  if (metrics.is_open()) metrics.close();
  claim.Release();
  RETURN_IF_ERROR(ran);
  if (!metrics) return absl::InternalError("writing metrics.jsonl failed");
  summary.threads_per_device = engine->threads_per_device();
  summary.arenas = engine->arena_uses();
  TLOG_INFO("trained {} iterations in {:.2f} s; final loss {:.6f}", iters,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), summary.final_loss);
  return summary;
}

}  // namespace tessera
