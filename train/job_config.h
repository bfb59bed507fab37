#pragma once
// The job config's schema (DESIGN §10; docs/config.md is made from it by
// `tessera config --schema`) and the typed structs the trainer reads.
//
// Namespaces, as LiBai's: `train` (incl. `train.dist`, `train.checkpointer`,
// `train.evaluation`), `optim` (by `_target_`: AdamW, SGD), `lr_scheduler`
// (by `_target_`, declared in train/lr_schedule.cc), `model` (by `_target_`:
// the models of models/), `tokenization` and `dataloader` (text data,
// train/text_data.h). Each key is declared once, in job_config.cc, with its
// schedule (lr_schedule.cc) or with its model (models/*.cc); the struct
// members below are what it fills.
//
// LoadJobConfig is what the CLI calls; ResolveJobConfig checks a config that
// arrives in any other way (a test, an embedding program, later an RPC) the
// same way. Both return the complete config; Train() and TrainingPlan()
// resolve their argument again, so an unchecked config never runs.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/schema.h"
#include "data/tokenizer.h"
#include "nlohmann/json.hpp"

namespace tessera {

// Devices that one node's actor ids can address (comm/proto/actor_id.h:
// the device index has 8 bits).
inline constexpr int64_t kMaxDevicesPerNode = 256;

struct DistConfig {
  std::string device_type = "cpu";
  std::optional<int64_t> data_parallel_size = 1;
  int64_t tensor_parallel_size = 1;
  int64_t pipeline_parallel_size = 1;
  std::optional<int64_t> num_devices;
  std::optional<int64_t> intra_op_threads;
  bool async_compute = false;
  double gradient_bucket_mb = 25;
  std::optional<int64_t> pipeline_num_layers;
  std::optional<std::vector<int64_t>> custom_pipeline_stage_id;  // a stage per layer; unset: LiBai's rule
};

// LiBai's `train.checkpointer`: when checkpoints are written (one is always
// written at the end of a run) and how many are kept.
struct CheckpointerConfig {
  std::optional<int64_t> period;  // iterations between checkpoints; unset: only at the end
  int64_t max_to_keep = 3;
  // Keep the weights of the best evaluation (train.evaluation.eval_metric,
  // eval_mode) in output_dir/checkpoints/best (LiBai's BestCheckpointer).
  bool save_best = false;
};

// LiBai's `train.evaluation`: the loss on the held-out (valid) split.
// LiBai's train.activation_checkpoint.
struct ActivationCheckpointConfig {
  bool enabled = false;
};

// LiBai's train.amp.
struct AmpConfig {
  bool enabled = false;
  std::string dtype = "bf16";
  double initial_loss_scale = 65536;     // fp16 only
  int64_t loss_scale_growth_interval = 2000;  // fp16 only
};

// LiBai's train.zero_optimization.
struct ZeroConfig {
  bool enabled = false;
  int64_t stage = 1;
};

struct EvaluationConfig {
  bool enabled = false;
  std::optional<int64_t> eval_period;  // iterations between evaluations; unset: only at the end
  std::optional<int64_t> eval_iter;    // batches per evaluation; unset: the whole valid split
  // What checkpointer.save_best compares: a metric evaluation reports
  // (EvalMetrics' names), lower ("min") or higher ("max") being better.
  std::string eval_metric = "eval_loss";
  std::string eval_mode = "min";
};

struct TrainConfig {
  std::string output_dir = "./output";
  int64_t train_micro_batch_size = 32;
  std::optional<int64_t> global_batch_size;
  std::optional<int64_t> num_accumulation_steps;
  int64_t train_iter = 10000;
  // Passes over the training split: when the text data's training samples
  // need more iterations, train_iter is raised to them (LiBai's rule,
  // applied where a job is prepared); 0: train_iter alone.
  int64_t train_epoch = 0;
  double warmup_ratio = 0.0;
  int64_t log_period = 20;
  int64_t seed = 1234;
  // Continue from the latest checkpoint in output_dir/checkpoints (if any).
  bool resume = false;
  // A checkpoint directory whose weights (not optimizer state) start the run.
  std::optional<std::string> load_weight;
  // Train nothing: evaluate load_weight's weights, or else the latest
  // checkpoint's in output_dir/checkpoints, once (LiBai's --eval-only).
  bool eval_only = false;
  // A run from scratch into an output_dir holding an earlier run's
  // checkpoints removes them (else it is refused).
  bool overwrite_output_dir = false;
  CheckpointerConfig checkpointer;
  EvaluationConfig evaluation;
  AmpConfig amp;
  ActivationCheckpointConfig activation_checkpoint;
  ZeroConfig zero_optimization;
  DistConfig dist;
};

// LiBai's `tokenization`: the tokenizer of the job's text data.
struct TokenizationConfig {
  std::optional<std::string> tokenizer;    // "gpt2" or "bert"; unset: no text data
  std::optional<std::string> vocab_file;   // gpt2: encoder.json; bert: vocab.txt
  std::optional<std::string> merges_file;  // gpt2: vocab.bpe
  bool lower_case = true;                  // bert
  std::optional<bool> append_eod;          // end each document with the end-of-document token; unset: GPT yes, BERT no
};

// The files of the tokenizer `tokenization` names (paths expanded); the
// key it needs and lacks is an InvalidArgument naming it. What training,
// `generate` and `export` load the tokenizer from.
[[nodiscard]] absl::StatusOr<data::TokenizerFiles> ConfiguredTokenizerFiles(const TokenizationConfig& tokenization);

// LiBai's `dataloader`: where the training text comes from.
struct DataloaderConfig {
  std::optional<std::string> data_prefix;  // an indexed dataset (PREFIX.bin/.idx); unset: the model's synthetic data
  std::optional<std::string> text_file;    // built into data_prefix (once) when that is missing
  std::string splits = "949,50,1";
  int64_t seed = 0;  // data order
};

struct AdamWConfig {
  double lr = 1e-4;
  double weight_decay = 0.01;
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  std::optional<double> clip_grad_max_norm = 1.0;
  double clip_grad_norm_type = 2.0;
  bool no_decay_norm_and_bias = true;
};

struct SgdConfig {
  double lr = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  std::optional<double> clip_grad_max_norm;
  double clip_grad_norm_type = 2.0;
  bool no_decay_norm_and_bias = true;
};

// The bindings (schema + reader) of each section.
const config::Binding<TrainConfig>& TrainKeys();
const config::Binding<AdamWConfig>& AdamWKeys();
const config::Binding<SgdConfig>& SgdKeys();
const config::Binding<TokenizationConfig>& TokenizationKeys();
const config::Binding<DataloaderConfig>& DataloaderKeys();

// The whole job's schema (models included).
const config::Section& JobSchema();

// Files + overrides -> the complete config, each key checked against the
// schema and overrides nothing reads refused (errors name the file or
// override that set the offending key). What ties keys to each other and to
// the model (batch arithmetic, the mesh, the model's layers) is checked when
// the job is built: Train, TrainingPlan.
absl::StatusOr<nlohmann::json> LoadJobConfig(const std::filesystem::path& path,
                                             const std::vector<std::string>& overrides = {});
// An override that sets a key of a feature `resolved` leaves off
// (train.amp.dtype with amp off, train.zero_optimization.stage with ZeRO
// off, eval_period / eval_iter with evaluation off, loss scaling without
// fp16, the synthetic data's keys on text data, dropout_seed without
// dropout, tokenizer files without a tokenizer or of the other one, warmup
// keys without warmup, gamma without milestones, the optimizer, schedule,
// checkpoints and log period under train.eval_only): nothing would read it,
// so it is an error naming the switch. Only overrides: configs and their
// bases keep such keys ready for the switch.
absl::Status CheckOverridesAreRead(const nlohmann::json& resolved, const std::vector<std::string>& overrides);
// --fast-dev-run (LiBai's): `overrides` plus those that make the job of
// `path` a brief check of its whole pipeline: 20 iterations from scratch, a
// progress line each, evaluations (when on, over 2 batches) and checkpoints
// at 10 and 20, written under train.output_dir/fast_dev_run so that a real
// run's outputs and checkpoints there are never touched (or pruned). Errors
// for a resume or an evaluation-only job.
absl::StatusOr<std::vector<std::string>> FastDevRunOverrides(const std::filesystem::path& path,
                                                             std::vector<std::string> overrides);
// A config from anywhere else; `origin` says where in messages
// ("from RPC SubmitJob"); empty: no origin.
absl::StatusOr<nlohmann::json> ResolveJobConfig(const nlohmann::json& config, const std::string& origin = "");
// The same, with where each key came from (config::ApplyOverrides records
// the overrides').
absl::StatusOr<nlohmann::json> ResolveJobConfig(const nlohmann::json& config, const config::Origins& origins);

}  // namespace tessera
