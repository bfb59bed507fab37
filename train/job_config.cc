#include "train/job_config.h"

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>

#include "core/config.h"
#include "core/file_util.h"
#include "core/json_text.h"
#include "core/status.h"
#include "core/text.h"
#include "models/model.h"
#include "train/lr_schedule.h"

namespace tessera {
namespace {

using config::Binding;
using config::KeySpec;
using config::KeyType;
using config::Section;

// Iterations and micro-batch offsets are 32-bit words of the Philox counters
// (dropout, synthetic data): past 2^32 iterations the random streams repeat.
constexpr double kMaxIterations = 4294967295.0;
constexpr double kMaxInt32 = 2147483647.0;

Binding<DistConfig> MakeDistKeys() {
  Binding<DistConfig> b("How the job is laid out over devices (LiBai's `train.dist`): the world is "
                        "data × tensor × pipeline virtual CPU devices.");
  b.Field("device_type", &DistConfig::device_type,
          {.choices = {"cpu", "cuda"},
           .doc = "device kind: virtual CPU devices (`cpu`) or GPUs (`cuda`: cuda:0 .. cuda:N-1 of the machine, one "
                  "rank per GPU, whose kernels run asynchronously on CUDA streams; collectives and pipeline "
                  "transfers between GPUs through NCCL, boxing's local steps as CUDA copies on the GPU)"});
  b.Field("data_parallel_size", &DistConfig::data_parallel_size,
          {.min = 1, .max = static_cast<double>(kMaxDevicesPerNode),
           .doc = "data-parallel degree; `null`: derived as `num_devices` / (tensor × pipeline)"});
  b.Field("tensor_parallel_size", &DistConfig::tensor_parallel_size,
          {.min = 1, .max = static_cast<double>(kMaxDevicesPerNode), .doc = "tensor-parallel degree"});
  b.Field("pipeline_parallel_size", &DistConfig::pipeline_parallel_size,
          {.min = 1, .max = static_cast<double>(kMaxDevicesPerNode), .doc = "pipeline stages"});
  b.Field("num_devices", &DistConfig::num_devices,
          {.min = 1, .max = static_cast<double>(kMaxDevicesPerNode),
           .doc = "virtual CPU devices; needed only when `data_parallel_size` is `null`, else it must equal "
                  "data × tensor × pipeline"});
  b.Field("intra_op_threads", &DistConfig::intra_op_threads,
          {.min = 1, .max = 1024,
           .doc = "kernel threads per device (its actor thread included); `null`: the machine's hardware threads "
                  "divided by the devices, at least 1"});
  b.Field("async_compute", &DistConfig::async_compute,
          {.doc = "each device's kernels (computes, accumulations, optimizer updates) run on a stream of their own "
                  "(on CPU a worker thread per device), each handing its outputs on when its kernel completed, so the "
                  "device's actor thread keeps scheduling (feeds, fetches, collectives) while kernels run; `false`: "
                  "kernels run on the actor thread. Same numbers either way; GPU jobs always run so"});
  b.Field("gradient_bucket_mb", &DistConfig::gradient_bucket_mb,
          {.min = 0,
           .max = 4096,
           .doc = "data parallelism (without ZeRO or tensor parallelism): gradients smaller than this are "
                  "all-reduced together in buckets of at most this many MiB, each as soon as its last gradient "
                  "exists (PyTorch DDP's bucket_cap_mb); 0: none, each gradient boxed on its own (P -> S(0) -> B: a "
                  "reduce-scatter, then an all-gather)"});
  b.Field("pipeline_num_layers", &DistConfig::pipeline_num_layers,
          {.min = 1, .max = 1 << 20,
           .doc = "the model's layer count, for LiBai's stage assignment; must equal the model's layers; `null`: "
                  "taken from the model"});
  b.Field("custom_pipeline_stage_id", &DistConfig::custom_pipeline_stage_id,
          {.min = 0,
           .max = static_cast<double>(kMaxDevicesPerNode - 1),
           .doc = "the pipeline stage of each layer, one entry per layer (e.g. `[0, 0, 0, 1]`: three layers on "
                  "stage 0, one on stage 1), never decreasing, every stage holding a layer; the embeddings go "
                  "with the first layer, the head and the loss with the last stage; `null`: LiBai's automatic "
                  "assignment"});
  return b;
}

Binding<CheckpointerConfig> MakeCheckpointerKeys() {
  Binding<CheckpointerConfig> b(
      "Checkpoints in `output_dir`/checkpoints: sharded safetensors, one file per rank, "
      "and an index (docs/checkpoints.md). One is always written at the end of a run.");
  b.Field("period", &CheckpointerConfig::period,
          {.min = 1, .max = kMaxIterations, .doc = "iterations between checkpoints; `null`: only at the end"});
  b.Field("max_to_keep", &CheckpointerConfig::max_to_keep,
          {.min = 1, .max = 1 << 20, .doc = "checkpoints kept (the newest); older ones are removed"});
  b.Field("save_best", &CheckpointerConfig::save_best,
          {.doc = "after each evaluation that improves on every earlier one of the run (`evaluation.eval_metric`, "
                  "`eval_mode`), write its weights to `output_dir`/checkpoints/best (LiBai's BestCheckpointer; "
                  "never pruned; a resume compares with it); needs `evaluation.enabled`"});
  return b;
}

Binding<ActivationCheckpointConfig> MakeActivationCheckpointKeys() {
  Binding<ActivationCheckpointConfig> b(
      "Recomputing activations in the backward pass (LiBai's activation checkpointing, per transformer layer).");
  b.Field("enabled", &ActivationCheckpointConfig::enabled,
          {.doc = "recompute each transformer layer's forward in backward: only the layers' inputs are kept from "
                  "forward; same losses bit for bit, more compute (GPT-2 124M on one device: 0.41x the memory, "
                  "0.77-0.85x the tokens/s; on a pipeline stage with several micro-batches in flight much less, "
                  "as their recomputed values do not share bytes: 0.67-0.96x)"});
  return b;
}

Binding<AmpConfig> MakeAmpKeys() {
  Binding<AmpConfig> b("Mixed precision: matmuls (attention's included) in a low-precision type, the rest in f32.");
  b.Field("enabled", &AmpConfig::enabled,
          {.doc = "each matmul reads its inputs cast to `dtype` and sums the products in f32; softmax, norms, "
                  "losses, reductions and the optimizer stay f32, the variables are the f32 master weights. bf16 "
                  "products run on oneDNN's bf16 GEMM where the CPU has AVX512-BF16, else on the inputs widened "
                  "to f32 (the same products, summed in f32; no speed-up)"});
  b.Field("dtype", &AmpConfig::dtype,
          {.choices = {"bf16", "fp16"},
           .doc = "the low-precision type. fp16 adds dynamic loss scaling (torch.cuda.amp.GradScaler's rule): the "
                  "loss times a scale is differentiated (each micro-batch's over the micro-batches, so the same steps "
                  "overflow whatever the accumulation or pipeline), the gradients divided by it; a step whose "
                  "gradients hold "
                  "a NaN or an infinity is skipped (weights and optimizer state unchanged) and halves the scale, "
                  "`loss_scale_growth_interval` clean steps in a row double it; metrics.jsonl gets `loss_scale`, "
                  "`skipped` (1 for a skipped step) and `skipped_steps` (since this process started the run). fp16 "
                  "products are widened to f32 on these CPUs"});
  b.Field("initial_loss_scale", &AmpConfig::initial_loss_scale,
          {.min = 1, .max = 1e38, .doc = "fp16: the first loss scale (read only with dtype fp16)"});
  b.Field("loss_scale_growth_interval", &AmpConfig::loss_scale_growth_interval,
          {.min = 1,
           .max = 16777216,  // the count is an f32 scalar on the device: exact up to 2^24
           .doc = "fp16: clean steps in a row before the scale doubles (read only with dtype fp16)"});
  return b;
}

Binding<ZeroConfig> MakeZeroKeys() {
  Binding<ZeroConfig> b(
      "Sharding parameters' optimizer state, gradients and the parameters themselves over the data-parallel ranks "
      "(ZeRO), expressed as SBP layouts: S(k) over the data-parallel axis.");
  b.Field("enabled", &ZeroConfig::enabled,
          {.doc = "shard each trained variable and its optimizer state over the data-parallel ranks: the update "
                  "runs on the shard (gradients reduce-scattered, the new values all-gathered); the losses of "
                  "plain data parallelism up to floating-point rounding (the sums go another way); a variable with no "
                  "axis of at least data_parallel_size elements that "
                  "tensor parallelism leaves unsplit stays whole. With data_parallel_size 1 nothing is sharded"});
  b.Field("stage", &ZeroConfig::stage,
          {.min = 1,
           .max = 3,
           .doc = "1: optimizer state and the f32 weights sharded, the weights gathered once per iteration; 2: also "
                  "the gradient accumulator (each micro-batch's gradient reduce-scattered into it; the same as 1 "
                  "without accumulation); 3: also the weights between uses, gathered for each reader in forward "
                  "and again in backward and freed after it (every layer's whole gradient is still held until its "
                  "reduce-scatter, which bounds what stage 3 saves over 1: GPT-2 124M, data 2, micro-batch 1, "
                  "seq 1: 1700 vs 1707 MiB a device)"});
  return b;
}

Binding<EvaluationConfig> MakeEvaluationKeys() {
  Binding<EvaluationConfig> b(
      "Evaluation on the held-out (valid) split of the text data: the mean loss and its "
      "perplexity, written to metrics.jsonl as `eval_loss` / `eval_ppl` beside the "
      "unigram baseline's `unigram_ppl` on the same samples (a unigram model of the train "
      "split).");
  b.Field("enabled", &EvaluationConfig::enabled, {.doc = "evaluate during training (needs text data: `dataloader`)"});
  b.Field("eval_period", &EvaluationConfig::eval_period,
          {.min = 1, .max = kMaxIterations, .doc = "iterations between evaluations; `null`: only at the end"});
  b.Field("eval_iter", &EvaluationConfig::eval_iter,
          {.min = 1,
           .max = kMaxIterations,
           .doc = "global batches (`global_batch_size` samples of the valid split each, in order) per evaluation, "
                  "at most as many as the split makes (the last one padded where the split ends inside it); `null`: "
                  "the whole valid split; either way each sample counts once (padding rows count for nothing)"});
  b.Field("eval_metric", &EvaluationConfig::eval_metric,
          {.doc = "the metric `checkpointer.save_best` keeps the best of, as metrics.jsonl names it (GPT: eval_loss, "
                  "eval_ppl; BERT: eval_loss, eval_mlm_loss, eval_nsp_loss, eval_mlm_accuracy, eval_nsp_accuracy)"});
  b.Field("eval_mode", &EvaluationConfig::eval_mode,
          {.choices = {"min", "max"}, .doc = "whether a lower (`min`) or higher (`max`) `eval_metric` is better"});
  return b;
}

Binding<TrainConfig> MakeTrainKeys() {
  Binding<TrainConfig> b("The training loop, as LiBai's `train` (configs/common/train.json).");
  b.Field("output_dir", &TrainConfig::output_dir,
          {.doc = "where config.json and metrics.jsonl are written (created if missing)"});
  b.Field("train_micro_batch_size", &TrainConfig::train_micro_batch_size,
          {.min = 1, .max = kMaxInt32, .doc = "samples per micro-batch on one data-parallel rank"});
  b.Field("global_batch_size", &TrainConfig::global_batch_size,
          {.min = 1, .max = kMaxInt32,
           .doc = "samples per iteration over all ranks: micro × accumulation × data_parallel_size; `null`: derived"});
  b.Field("num_accumulation_steps", &TrainConfig::num_accumulation_steps,
          {.min = 1,
           .max = 1 << 20,
           .doc = "micro-batches per iteration (gradient accumulation); `null`: derived from `global_batch_size`, "
                  "else 1 (the micro batch is always given); a global batch that contradicts the other two is an "
                  "error"});
  b.Field("train_iter", &TrainConfig::train_iter,
          {.min = 1, .max = kMaxIterations, .doc = "iterations to train (at most 2^32 - 1: the random streams count them in 32 bits)"});
  b.Field("train_epoch", &TrainConfig::train_epoch,
          {.min = 0,
           .max = kMaxIterations,
           .doc = "passes over the text data's training split (`dataloader`): `train_iter` becomes the larger of "
                  "itself and ceil(epochs × training samples / global batch), as LiBai does (warmup and the "
                  "schedule follow it); 0: `train_iter` alone"});
  b.Unbound("start_iter", KeySpec{.type = KeyType::kInt,
                                  .default_value = 0,
                                  .not_implemented = "set train.resume to continue from a checkpoint",
                                  .doc = "iteration to resume from"});
  b.Field("warmup_ratio", &TrainConfig::warmup_ratio,
          {.min = 0,
           .max = 1,
           .doc = "fraction of `train_iter` spent in the learning-rate warmup (its iterations: "
                  "ceil(warmup_ratio × train_iter), as LiBai's)"});
  b.Field("log_period", &TrainConfig::log_period,
          {.min = 1, .doc = "iterations between progress lines and metrics.jsonl records (the last one is always written)"});
  b.Field("seed", &TrainConfig::seed,
          {.min = 0, .doc = "seeds all randomness a model does not seed itself (its `*_seed` keys left `null`)"});
  b.Sub("amp", &TrainConfig::amp, MakeAmpKeys());
  b.Sub("activation_checkpoint", &TrainConfig::activation_checkpoint, MakeActivationCheckpointKeys());
  b.Sub("zero_optimization", &TrainConfig::zero_optimization, MakeZeroKeys());
  b.Sub("checkpointer", &TrainConfig::checkpointer, MakeCheckpointerKeys());
  b.Field("resume", &TrainConfig::resume,
          {.doc = "continue from the latest checkpoint in `output_dir`/checkpoints, bit-exactly (weights, optimizer "
                  "state, data position, learning-rate step and random streams), under any parallel layout; with "
                  "none there, start from scratch (`tessera train --resume` sets it)"});
  b.Field("load_weight", &TrainConfig::load_weight,
          {.doc = "a checkpoint directory (`output_dir`/checkpoints/iter_N) or Hugging Face GPT-2 or BERT weights (a "
                  "model.safetensors file or its directory) whose weights start this run, resharded to its layout; "
                  "optimizer state and the iteration start fresh; `null`: the model's init"});
  b.Field("eval_only", &TrainConfig::eval_only,
          {.doc = "train nothing: evaluate once (`evaluation`, which must be enabled) the weights of `load_weight`, "
                  "or else of the latest checkpoint in `output_dir`/checkpoints, and write no outputs "
                  "(`tessera train --eval-only` sets it)"});
  b.Field("overwrite_output_dir", &TrainConfig::overwrite_output_dir,
          {.doc = "a run from scratch (no `resume`) into an `output_dir` that holds an earlier run's checkpoints "
                  "moves them into `checkpoints/.overwritten/` as it starts and removes them when it has written its "
                  "first (a run that fails before leaves them there, out of `--resume`'s sight); `false`: such "
                  "a run is refused (its checkpoints would sit among the earlier ones). `tessera train "
                  "--fast-dev-run` sets it for its own directory"});
  b.Sub("evaluation", &TrainConfig::evaluation, MakeEvaluationKeys());
  b.Sub("dist", &TrainConfig::dist, MakeDistKeys());
  return b;
}

// Keys every optimizer has; `weight_decay_doc` says how it applies its decay.
template <typename T>
void CommonOptimizerKeys(Binding<T>& b, std::string weight_decay_doc) {
  b.Field("lr", &T::lr, {.min = 0, .exclusive_min = true, .doc = "peak learning rate (the schedule scales it)"});
  b.Field("weight_decay", &T::weight_decay, {.min = 0, .doc = std::move(weight_decay_doc)});
  b.Field("clip_grad_max_norm", &T::clip_grad_max_norm,
          {.min = 0, .exclusive_min = true, .doc = "clip gradients to this global norm; `null`: no clipping"});
  b.Field("clip_grad_norm_type", &T::clip_grad_norm_type,
          {.min = 0,
           .exclusive_min = true,
           .allow_inf = true,
           .doc = "p of the global norm that `clip_grad_max_norm` bounds (and that `grad_norm` reports), as "
                  "torch.nn.utils.clip_grad_norm_: (Σ |g|^p)^(1/p) over every gradient element; \"inf\" (or a p past "
                  "3.4e38, f32's range): max |g|"});
  b.Field("no_decay_norm_and_bias", &T::no_decay_norm_and_bias,
          {.doc = "no weight decay on biases and normalisation weights, as LiBai"});
}

Binding<AdamWConfig> MakeAdamWKeys() {
  Binding<AdamWConfig> b("AdamW with decoupled weight decay and bias correction.");
  CommonOptimizerKeys(b,
                      "decoupled weight decay, as torch.optim.AdamW: each step first scales the weight by "
                      "1 - lr × weight_decay");
  b.Field("betas", &AdamWConfig::betas,
          {.min = 0, .max = 1, .exclusive_max = true, .min_length = 2, .max_length = 2, .doc = "Adam's moment decay rates"});
  b.Field("eps", &AdamWConfig::eps, {.min = 0, .exclusive_min = true, .doc = "Adam's denominator epsilon"});
  return b;
}

Binding<SgdConfig> MakeSgdKeys() {
  Binding<SgdConfig> b("SGD with optional (Nesterov) momentum.");
  CommonOptimizerKeys(b,
                      "L2 weight decay, as torch.optim.SGD: weight_decay × weight is added to the gradient "
                      "before the momentum");
  b.Field("momentum", &SgdConfig::momentum, {.min = 0, .max = 1, .exclusive_max = true, .doc = "momentum factor"});
  b.Field("nesterov", &SgdConfig::nesterov, {.doc = "Nesterov momentum (needs momentum > 0)"});
  return b;
}


Binding<TokenizationConfig> MakeTokenizationKeys() {
  Binding<TokenizationConfig> b(
      "The tokenizer of the job's text data (LiBai's `tokenization`). Paths may start with "
      "`~/` (the home directory), `~user/` (that user's) or `$TESSERA_CACHE/` (default `~/.cache/tessera`, where "
      "scripts/install_deps.sh puts the GPT-2 vocabulary).");
  b.Field("tokenizer", &TokenizationConfig::tokenizer,
          {.choices = {"gpt2", "bert"},
           .doc = "`gpt2`: byte-level BPE (encoder.json + vocab.bpe, also what `tessera preprocess --tokenizer bpe:N` "
                  "trains); `bert`: WordPiece (vocab.txt); `null`: no text data"});
  b.Field("vocab_file", &TokenizationConfig::vocab_file, {.doc = "gpt2: encoder.json; bert: vocab.txt"});
  b.Field("merges_file", &TokenizationConfig::merges_file, {.doc = "gpt2: vocab.bpe (the merges)"});
  b.Field("lower_case", &TokenizationConfig::lower_case, {.doc = "bert: lower-case and strip accents"});
  b.Field("append_eod", &TokenizationConfig::append_eod,
          {.doc = "end each document with the end-of-document token when the text is preprocessed; `null`: yes for "
                  "GPT, no for BERT (whose samples are sentence pairs)"});
  return b;
}

Binding<DataloaderConfig> MakeDataloaderKeys() {
  Binding<DataloaderConfig> b(
      "Where the training text comes from (LiBai's `dataloader`): a Megatron-style indexed "
      "dataset read in windows of `model.seq_length` + 1 tokens, in a seeded order that is "
      "the same under every parallel layout. Paths as in `tokenization`.");
  b.Field("data_prefix", &DataloaderConfig::data_prefix,
          {.doc = "the indexed dataset PREFIX.bin + PREFIX.idx (`tessera preprocess` writes them, and "
                  "PREFIX.source.json: one encoded with another vocabulary than the job's tokenizer is an error); "
                  "`null`: the model's own synthetic data"});
  b.Field("text_file", &DataloaderConfig::text_file,
          {.doc = "a text file (paragraphs are documents; `.jsonl`: a \"text\" field per line) preprocessed into "
                  "`data_prefix` with the job's tokenizer when that dataset does not exist yet (an existing one is "
                  "used as it is, with a warning when the text file changed after it was built, and is an error "
                  "when its PREFIX.source.json names another file); `null`: none"});
  b.Field("splits", &DataloaderConfig::splits,
          {.doc = "train,valid,test weights over the documents, as Megatron's (up to three, missing ones 0; "
                  "evaluation reads the valid split)"});
  b.Field(
      "seed", &DataloaderConfig::seed,
      {.min = 0, .derive_seed_from = "train.seed", .doc = "seed of the data order; `null`: derived from train.seed"});
  return b;
}

Section MakeJobSchema() {
  Section root;
  root.Sub("train", TrainKeys().section());
  root.Sub("optim", Section("The optimizer, by `_target_`.")
                        .Target("AdamW", AdamWKeys().section())
                        .Target("SGD", SgdKeys().section())
                        .DefaultTarget("AdamW"));
  root.Sub("lr_scheduler", LrSchedulerSection());
  Section model("The model, by `_target_`; each model declares its keys.");
  for (const models::ModelType& type : models::BuiltinModelTypes()) model.Target(type.name, type.keys);
  root.Sub("model", std::move(model.Required()));
  root.Sub("dataloader", DataloaderKeys().section());
  root.Sub("tokenization", TokenizationKeys().section());
  return root;
}

}  // namespace

const Binding<TrainConfig>& TrainKeys() {
  static const auto* const keys = new Binding<TrainConfig>(MakeTrainKeys());
  return *keys;
}
const Binding<AdamWConfig>& AdamWKeys() {
  static const auto* const keys = new Binding<AdamWConfig>(MakeAdamWKeys());
  return *keys;
}
const Binding<SgdConfig>& SgdKeys() {
  static const auto* const keys = new Binding<SgdConfig>(MakeSgdKeys());
  return *keys;
}

const Binding<TokenizationConfig>& TokenizationKeys() {
  static const auto* const keys = new Binding<TokenizationConfig>(MakeTokenizationKeys());
  return *keys;
}
const Binding<DataloaderConfig>& DataloaderKeys() {
  static const auto* const keys = new Binding<DataloaderConfig>(MakeDataloaderKeys());
  return *keys;
}

const Section& JobSchema() {
  static const auto* const schema = new Section(MakeJobSchema());
  return *schema;
}

absl::StatusOr<data::TokenizerFiles> ConfiguredTokenizerFiles(const TokenizationConfig& t) {
  if (!t.tokenizer) return absl::InvalidArgumentError("tokenization.tokenizer is null");
  data::TokenizerFiles files;
  files.kind = *t.tokenizer;
  if (!t.vocab_file) {
    return absl::InvalidArgumentError(StrCat("tokenization.vocab_file must be set for tokenizer '", files.kind, "'"));
  }
  files.vocab_file = ExpandPath(*t.vocab_file);
  if (files.kind == "gpt2") {
    if (!t.merges_file) return absl::InvalidArgumentError("tokenization.merges_file must be set for tokenizer 'gpt2'");
    files.merges_file = ExpandPath(*t.merges_file);
  }
  files.lower_case = t.lower_case;
  return files;
}

namespace {

// The dotted keys an override sets: its key, or each leaf under it when its
// value is an object (`train={"train_iter": 5}` sets train.train_iter). A
// null sets nothing (`tokenization.vocab_file=null` asks for the key's
// absence, which no switch makes unread).
std::vector<std::string> KeysSetBy(const std::string& text) {
  const absl::StatusOr<config::Override> parsed = config::ParseOverride(text);
  if (!parsed.ok()) return {text.substr(0, text.find('='))};
  std::vector<std::string> keys;
  const std::function<void(const std::string&, const nlohmann::json&)> walk = [&](const std::string& key,
                                                                                  const nlohmann::json& value) {
    if (value.is_null()) return;
    if (!value.is_object() || value.empty()) {
      keys.push_back(key);
      return;
    }
    for (const auto& [name, inner] : value.items()) walk(StrCat(key, ".", name), inner);
  };
  walk(parsed->key, parsed->value);
  return keys;
}

}  // namespace

absl::Status CheckOverridesAreRead(const nlohmann::json& resolved, const std::vector<std::string>& overrides) {
  // A feature's keys and the switch that has them read. (eval_metric and
  // eval_mode answer to checkpointer.save_best, which checks them itself.)
  struct Gate {
    std::string_view key;
    std::string_view on;  // a boolean of the resolved config
  };
  static constexpr Gate kGates[] = {
      {"train.amp.dtype", "train.amp.enabled"},
      {"train.amp.initial_loss_scale", "train.amp.enabled"},
      {"train.amp.loss_scale_growth_interval", "train.amp.enabled"},
      {"train.zero_optimization.stage", "train.zero_optimization.enabled"},
      {"train.evaluation.eval_period", "train.evaluation.enabled"},
      {"train.evaluation.eval_iter", "train.evaluation.enabled"},
  };
  const auto data_prefix = nlohmann::json::json_pointer("/dataloader/data_prefix");
  const bool text_data = resolved.contains(data_prefix) && !resolved.at(data_prefix).is_null();
  // (BERT has no synthetic data: its own check says it needs text.)
  const auto target = nlohmann::json::json_pointer("/model/_target_");
  const bool synthetic_data = !resolved.contains(target) || resolved.at(target) != "models.BERT";
  const absl::StatusOr<bool> eval_only_key = config::GetBool(resolved, "train.eval_only");
  const bool eval_only = eval_only_key.ok() && *eval_only_key;
  for (const std::string& text : overrides) {
    for (const std::string& key : KeysSetBy(text)) {
      for (const Gate& gate : kGates) {
        if (key != gate.key) continue;
        const absl::StatusOr<bool> on = config::GetBool(resolved, gate.on);
        if (on.ok() && !*on) {
          return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text),
                                                   "' sets a key nothing reads while ", gate.on, " is false (add ",
                                                   gate.on, "=true)"));
        }
      }
      // Keys of the text data, and the synthetic data's own.
      if ((key == "dataloader.seed" || key == "dataloader.splits") && !text_data && synthetic_data) {
        return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text),
                                                 "' sets a key nothing reads without dataloader.data_prefix (the "
                                                 "model's synthetic data has no splits or order to set)"));
      }
      if ((key == "model.markov_successors" || key == "model.data_seed") && text_data) {
        return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text),
                                                 "' sets a key of the synthetic data, which a run on "
                                                 "dataloader.data_prefix does not read"));
      }
      if (key == "model.dropout_seed" && resolved.contains("model") && resolved.at("model").is_object()) {
        bool dropout = false;
        for (const auto& [name, value] : resolved.at("model").items()) {
          dropout |= name.ends_with("dropout_prob") && value.is_number() && value.get<double>() > 0;
        }
        if (!dropout) {
          return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text),
                                                   "' sets a key nothing reads: every model.*dropout_prob is 0 (no "
                                                   "dropout masks to seed)"));
        }
      }
      if (key == "model.init_seed" || key == "model.initializer_range" ||
          key == "model.use_scaled_init_for_output_weights") {
        // (Every weight comes from the checkpoint: BindCheckpointInitializers
        // refuses one that lacks a tensor of the model.)
        const auto load_weight = nlohmann::json::json_pointer("/train/load_weight");
        const bool loads = resolved.contains(load_weight) && !resolved.at(load_weight).is_null();
        if (loads || eval_only) {
          return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text), "' sets a key nothing reads ",
                                                   loads ? "with train.load_weight" : "with train.eval_only",
                                                   " (every weight comes from the checkpoint)"));
        }
      }
      if (key == "optim.no_decay_norm_and_bias") {
        const absl::StatusOr<double> decay = config::GetDouble(resolved, "optim.weight_decay");
        if (decay.ok() && *decay == 0) {
          return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text),
                                                   "' sets a key nothing reads while optim.weight_decay is 0 (no "
                                                   "decay to exempt norms and biases from)"));
        }
      }
      if (key.starts_with("tokenization.") && key != "tokenization.tokenizer") {
        const auto tokenizer = nlohmann::json::json_pointer("/tokenization/tokenizer");
        const std::string kind = resolved.contains(tokenizer) && resolved.at(tokenizer).is_string()
                                     ? resolved.at(tokenizer).get<std::string>()
                                     : "";
        std::string why;
        if (kind.empty()) {
          why = "while tokenization.tokenizer is null";
        } else if ((key == "tokenization.lower_case" && kind != "bert") ||
                   (key == "tokenization.merges_file" && kind != "gpt2")) {
          why = StrCat("with tokenization.tokenizer ", kind, " (", key, " is ",
                       key == "tokenization.lower_case" ? "bert's" : "gpt2's", ")");
        }
        if (!why.empty()) {
          return absl::InvalidArgumentError(
              StrCat("override '", config::ShortText(text), "' sets a key nothing reads ", why));
        }
      }
      if (key == "lr_scheduler.warmup_factor" || key == "lr_scheduler.warmup_method") {
        const absl::StatusOr<double> ratio = config::GetDouble(resolved, "train.warmup_ratio");
        if (ratio.ok() && *ratio == 0) {
          return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text),
                                                   "' sets a key nothing reads while train.warmup_ratio is 0 (no "
                                                   "warmup)"));
        }
      }
      if (key == "lr_scheduler.gamma") {
        const auto milestones = nlohmann::json::json_pointer("/lr_scheduler/milestones");
        if (resolved.contains(milestones) && resolved.at(milestones).is_array() && resolved.at(milestones).empty()) {
          return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text),
                                                   "' sets a key nothing reads while lr_scheduler.milestones is empty "
                                                   "(gamma multiplies the learning rate at each milestone)"));
        }
      }
      // train.eval_only evaluates saved weights once: the optimizer, its
      // schedule, checkpoints, training logs and resuming are not read.
      // (The run's length, train_iter or train_epoch, and its evaluation
      // period stay accepted, unread: an evaluation is the training's
      // command line with --eval-only.)
      // (Nor activation checkpointing: the evaluation's forward keeps no
      // activations for a backward.)
      // (Nor loss scaling and gradient buckets, which no backward reads.
      // Dropout, off in the evaluation's graph, stays accepted as the run's
      // length does: a training command line sets it.)
      if (eval_only && (key.starts_with("optim.") || key.starts_with("lr_scheduler.") || key == "train.warmup_ratio" ||
                        key.starts_with("train.checkpointer.") || key == "train.log_period" || key == "train.resume" ||
                        key.starts_with("train.activation_checkpoint.") || key == "train.amp.initial_loss_scale" ||
                        key == "train.amp.loss_scale_growth_interval" || key == "train.dist.gradient_bucket_mb")) {
        return absl::InvalidArgumentError(
            StrCat(key == "train.resume" ? std::string("--resume (train.resume) means nothing")
                                         : StrCat("override '", config::ShortText(text), "' sets a key nothing reads"),
                   " with train.eval_only (--eval-only evaluates saved weights once, the latest checkpoint's "
                   "or train.load_weight's: no training, checkpoints or logs)"));
      }
      if (key == "train.dist.async_compute") {
        const absl::StatusOr<std::string> device = config::GetString(resolved, "train.dist.device_type");
        if (device.ok() && *device == "cuda") {
          return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text),
                                                   "' sets a key nothing reads with train.dist.device_type cuda "
                                                   "(GPU kernels always run asynchronously on their streams)"));
        }
      }
      if (key == "train.warmup_ratio") {
        // (0, no warmup, is what ConstantLR does.)
        const absl::StatusOr<std::string> schedule = config::GetString(resolved, "lr_scheduler._target_");
        const absl::StatusOr<double> ratio = config::GetDouble(resolved, "train.warmup_ratio");
        if (schedule.ok() && *schedule == "ConstantLR" && ratio.ok() && *ratio > 0) {
          return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text),
                                                   "' sets a key nothing reads with lr_scheduler._target_ ConstantLR "
                                                   "(it has no warmup; the Warmup* schedules read it)"));
        }
      }
      if (key == "train.dist.gradient_bucket_mb") {
        // Read by plain data parallelism only: several data-parallel ranks,
        // no tensor parallelism, no ZeRO (whose gradients are reduce-scattered).
        const absl::StatusOr<int64_t> tensor = config::GetInt(resolved, "train.dist.tensor_parallel_size");
        const absl::StatusOr<int64_t> pipeline = config::GetInt(resolved, "train.dist.pipeline_parallel_size");
        absl::StatusOr<int64_t> data = config::GetInt(resolved, "train.dist.data_parallel_size");
        if (!data.ok() && tensor.ok() && pipeline.ok() && *tensor > 0 && *pipeline > 0) {
          const absl::StatusOr<int64_t> devices = config::GetInt(resolved, "train.dist.num_devices");
          if (devices.ok()) data = *devices / (*tensor * *pipeline);
        }
        const absl::StatusOr<bool> zero = config::GetBool(resolved, "train.zero_optimization.enabled");
        std::string why;
        if (zero.ok() && *zero) {
          why = "with train.zero_optimization.enabled (ZeRO reduce-scatters each gradient)";
        } else if (tensor.ok() && *tensor > 1) {
          why = "with train.dist.tensor_parallel_size > 1";
        } else if (data.ok() && *data == 1) {
          why = "with one data-parallel rank (nothing is all-reduced)";
        }
        if (!why.empty()) {
          return absl::InvalidArgumentError(StrCat("override '", config::ShortText(text), "' sets a key nothing reads ",
                                                   why, ": gradients are bucketed under plain data parallelism only"));
        }
      }
      if (key == "train.amp.initial_loss_scale" || key == "train.amp.loss_scale_growth_interval") {
        const absl::StatusOr<std::string> dtype = config::GetString(resolved, "train.amp.dtype");
        if (dtype.ok() && *dtype != "fp16") {
          return absl::InvalidArgumentError(
              StrCat("override '", config::ShortText(text),
                     "' sets a key read only with train.amp.dtype fp16 (loss scaling), not ", *dtype));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> LoadJobConfig(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(nlohmann::json config, config::LoadConfig(path, overrides, JobSchema()));
  RETURN_IF_ERROR(CheckOverridesAreRead(config, overrides));
  return config;
}

absl::StatusOr<std::vector<std::string>> FastDevRunOverrides(const std::filesystem::path& path,
                                                             std::vector<std::string> overrides) {
  ASSIGN_OR_RETURN(const nlohmann::json config, LoadJobConfig(path, overrides));
  const nlohmann::json& train = config.at("train");
  if (train.at("resume").get<bool>()) {
    return absl::InvalidArgumentError("--fast-dev-run starts from scratch: it takes no --resume (train.resume)");
  }
  if (train.at("eval_only").get<bool>()) {
    return absl::InvalidArgumentError("--fast-dev-run trains: it takes no --eval-only (train.eval_only)");
  }
  // The keys it sets itself: an override of one would be dropped.
  static constexpr std::string_view kSet[] = {"train.train_epoch",          "train.train_iter",
                                              "train.log_period",           "train.checkpointer.period",
                                              "train.overwrite_output_dir", "train.evaluation.eval_period",
                                              "train.evaluation.eval_iter"};
  for (const std::string& text : overrides) {
    for (const std::string& key : KeysSetBy(text)) {
      if (std::find(std::begin(kSet), std::end(kSet), key) != std::end(kSet)) {
        return absl::InvalidArgumentError(
            StrCat("override '", config::ShortText(text), "': --fast-dev-run sets ", key,
                   " itself (20 iterations, a line each, checkpoints and evaluations at 10 "
                   "and 20, into train.output_dir/fast_dev_run)"));
      }
    }
  }
  overrides.insert(overrides.end(),
                   {"train.train_epoch=0", "train.train_iter=20", "train.log_period=1", "train.checkpointer.period=10",
                    "train.overwrite_output_dir=true",
                    "train.output_dir=" +
                        (std::filesystem::path(train.at("output_dir").get<std::string>()) / "fast_dev_run").string()});
  // Evaluations only where the job has them (the keys are read only then).
  if (train.at("evaluation").at("enabled").get<bool>()) {
    overrides.insert(overrides.end(), {"train.evaluation.eval_period=10", "train.evaluation.eval_iter=2"});
  }
  return overrides;
}

absl::StatusOr<nlohmann::json> ResolveJobConfig(const nlohmann::json& config, const std::string& origin) {
  config::Origins origins;
  if (!origin.empty()) origins[""] = origin;
  return ResolveJobConfig(config, origins);
}

absl::StatusOr<nlohmann::json> ResolveJobConfig(const nlohmann::json& config, const config::Origins& origins) {
  return config::Resolve(JobSchema(), config, origins);
}

}  // namespace tessera
