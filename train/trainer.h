#pragma once
// The trainer (DESIGN §10): checks the config against the job schema
// (train/job_config.h), builds the model (`model._target_`), compiles it
// with the optimizer of `optim` (AdamW or SGD) on the mesh of `train.dist`,
// runs train.train_iter iterations through the Engine and writes, in
// train.output_dir, once the first iteration has trained (so a job that
// fails to start leaves nothing behind):
//   - config.json: the resolved config (atomic SaveConfig);
//   - metrics.jsonl: one JSON object per logged iteration (every
//     train.log_period and the last): iter, loss, lr, grad_norm (absent
//     without clipping), samples_per_s.
// The learning rate follows `lr_scheduler` (train/lr_schedule.h).
// global batch = train_micro_batch_size × num_accumulation_steps ×
// data-parallel size (any two set give the third).
// Not done here: checkpoints and evaluation, which the job runner behind
// `tessera train` and the cluster does (cluster/engine_job.h); their keys
// are refused by this call.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"
#include "models/model.h"
#include "nlohmann/json.hpp"
#include "train/engine.h"
#include "train/job_config.h"
#include "train/lr_schedule.h"
#include "train/text_data.h"

namespace tessera {

struct TrainSummary {
  // Losses are recorded for the first kMaxRecordedLosses iterations only,
  // so a long job's memory does not grow with train.train_iter
  // (metrics.jsonl has the logged ones).
  static constexpr int64_t kMaxRecordedLosses = 1 << 16;
  std::vector<double> losses;
  int64_t iterations = 0;  // iterations trained
  double final_loss = 0;   // loss of the last one
  int threads_per_device = 0;  // kernel threads of each device
  // Per device: its arena's bytes and the most of them in use at once
  // (actors/arena.h).
  std::vector<actors::ArenaMonitor::Use> arenas;
};

// The data of a job, from its config alone (what every node of a cluster
// run builds for its sources): the model's batches (the iteration's global
// batch, cut into micro-batches) and the learning rate of `lr_scheduler`.
// Thread-safe: the feed may be called from several device threads at once.
class JobFeed {
 public:
  // `plan_only` (`tessera plan`: it writes nothing, and takes no time of
  // the corpus's size): the text data as TextData::Open's plan_only opens
  // it; a feed of no use but for its checks.
  static absl::StatusOr<std::unique_ptr<JobFeed>> Make(const nlohmann::json& config, bool plan_only = false);
  // Borrows this object.
  FeedFn feed() {
    return [this](int64_t iteration, int64_t micro_batch, std::string_view input, const Tensor& out) {
      return Fill(iteration, micro_batch, input, out);
    };
  }
  absl::Status Fill(int64_t iteration, int64_t micro_batch, std::string_view input, const Tensor& out);
  // Evaluation batch `batch` (train.evaluation): rows of the valid split,
  // and the evaluation graph's sample weights (models/model.h): 0 for the
  // rows past the samples evaluated, which pad the last batch.
  absl::Status FillEval(int64_t batch, std::string_view input, const Tensor& out) const;
  // Runs of the evaluation plan per evaluation: as many micro-batches as
  // cover eval_samples(); 0 when evaluation is off.
  int64_t eval_batches() const { return eval_batches_; }
  // Samples per evaluation, each counted once: the first
  // train.evaluation.eval_iter global batches' worth of the valid split (at
  // most all of it), else the whole split.
  int64_t eval_samples() const { return eval_samples_; }
  // The evaluation metrics whose sum is eval_loss (models/model.h).
  const std::vector<std::string>& eval_loss_terms() const { return eval_loss_terms_; }
  // The model's Hugging Face layout (Model::HuggingFaceTensors()), for
  // reading Hugging Face weights.
  const std::vector<models::Model::HfTensor>& hf_layout() const { return hf_layout_; }
  // Tokens per sample of a language model (its sequence length); 0 for
  // models that read no text.
  int64_t tokens_per_sample() const { return tokens_per_sample_; }
  // Whether eval_loss is a per-token language-model loss whose exp is a
  // perplexity (GPT-style models; not BERT's MLM + NSP sum).
  bool reports_perplexity() const { return reports_perplexity_; }

  // What a node reports of the job (the trainer's metrics.jsonl fields).
  // lr: `iteration` >= 0 (counted from 0; a negative one is a CHECK failure).
  double lr(int64_t iteration) const { return schedule_->At(iteration); }
  int64_t global_batch() const { return global_batch_; }  // samples per iteration
  int64_t iterations() const { return iterations_; }      // train.train_iter
  int64_t log_period() const { return log_period_; }      // train.log_period
  int64_t devices() const { return devices_; }            // the job's world size
  // train.dist.intra_op_threads: threads per device; 0 = unset (the runner
  // shares the machine's cores between its devices).
  int intra_op_threads() const { return intra_op_threads_; }
  // The job's text data (null: the model's own synthetic data).
  const TextData* text() const { return text_.get(); }
  // The job's resolved config and its `train` section.
  const nlohmann::json& config() const { return config_; }
  const TrainConfig& train() const { return train_; }

 private:
  JobFeed() = default;
  struct GlobalBatch {
    int64_t iteration = -1;
    Tensor tensor;
  };
  std::unique_ptr<models::Model> model_;
  std::unique_ptr<TextData> text_;  // null: the model's own data
  std::optional<LrSchedule> schedule_;  // set by Make
  int64_t micro_batches_ = 1;
  int64_t global_batch_ = 0;
  int64_t iterations_ = 0;
  int64_t log_period_ = 1;
  int64_t devices_ = 1;
  int intra_op_threads_ = 0;
  int64_t eval_batches_ = 0;
  int64_t eval_samples_ = 0;
  std::vector<std::string> eval_loss_terms_;
  std::vector<models::Model::HfTensor> hf_layout_;
  int64_t tokens_per_sample_ = 0;
  bool reports_perplexity_ = false;
  std::string lr_input_;
  nlohmann::json config_;
  TrainConfig train_;
  std::mutex mu_;
  std::map<std::string, GlobalBatch, std::less<>> global_batches_ ABSL_GUARDED_BY(mu_);
};

// Where a run starts: from scratch (iteration 0, the init rules), from the
// latest checkpoint in output_dir/checkpoints (train.resume: everything, at
// its iteration), or from a checkpoint's weights (train.load_weight: at
// iteration 0, optimizer state fresh). A resume finding no checkpoint starts
// from scratch. A resume must keep the checkpoint's global batch (the data
// position is iteration × global batch) and, where the resolved `config`
// and the checkpoint's both have one, its model.seq_length (the samples
// counted are windows of that many tokens); any layout and world size may
// change.
struct RunStart {
  int64_t iteration = 0;
  std::string checkpoint;  // empty: the init rules
  bool weights_only = false;
  // Said, not refused (a resume with other seeds): for the run's log.
  std::vector<std::string> warnings;
};
// `hf_layout`: the model's Hugging Face layout, to read Hugging Face weights
// in train.load_weight (CheckpointReader::Open). A run that writes refuses an
// output_dir holding an earlier run's checkpoints (without resume or
// overwrite_output_dir); `for_writing` false (a plan) leaves them be.
absl::StatusOr<RunStart> ResolveRunStart(const TrainConfig& train, const nlohmann::json& config, int64_t global_batch,
                                         const std::vector<models::Model::HfTensor>& hf_layout,
                                         bool for_writing = true);

// The metrics an evaluation reports (metrics.jsonl's eval_* fields, but the
// unigram baseline's), from the sums over its `runs` runs of the evaluation
// graph's scalar fetches, by name (models/model.h's rules): pairs
// <m>_sum / <m>_weight give eval_<m>, <m>_correct / <m>_count
// eval_<m>_accuracy, other fetches their mean; eval_loss sums the eval
// values of `loss_terms`, and with `perplexity` eval_ppl = exp(eval_loss).
// A pair whose weight is 0 reports nothing; a loss term missing is
// InternalError; `runs` < 1 InvalidArgument.
absl::StatusOr<std::map<std::string, double>> EvalMetrics(const std::map<std::string, double>& sums, int64_t runs,
                                                          const std::vector<std::string>& loss_terms, bool perplexity);

// The job's plan for a cluster: global ranks fill the nodes in order
// (devices_per_node, which must sum to the job's devices), one NodePlan per
// node, each carrying the resolved config (NodePlan.job_config: what its
// JobFeed is made from) and where its parameters start (ResolveRunStart:
// the plan's start_iteration, NodePlan.init_checkpoint).
absl::StatusOr<std::vector<proto::NodePlan>> CompileForNodes(const nlohmann::json& config,
                                                             const std::vector<uint32_t>& devices_per_node);

// The progress line Train prints for a logged iteration, from its
// metrics.jsonl fields (loss, lr, grad_norm where clipping fetches it,
// samples_per_s): "iter 3/10  loss 5.123456  lr 0.0003  grad_norm 0.87
// samples/s 160\n" (the fields of `tessera train`'s lines, train/progress.h).
std::string FormatProgressLine(int64_t iteration, int64_t iterations, const nlohmann::json& metrics);

// Fails (INVALID_ARGUMENT or PERMISSION_DENIED, naming train.output_dir)
// unless `dir` is a directory this process can write into, or can create:
// checked before a run so that bad input leaves nothing behind.
absl::Status CheckOutputDir(const std::filesystem::path& dir);

// The plan Train would run (same config checks), for `tessera plan`.
absl::StatusOr<proto::Plan> TrainingPlan(const nlohmann::json& config);

// The plans of the job `tessera train` would run: the training plan and,
// with train.evaluation.enabled, the evaluation's, which a run loads
// between training segments while it holds the trained parameters and
// optimizer state for the next segment (train.eval_only: the evaluation
// alone, from a checkpoint).
struct JobPlans {
  proto::Plan training;
  std::optional<proto::Plan> evaluation;
  bool evaluation_only = false;
  // What a run would refuse that a plan does not (it writes nothing): an
  // earlier run's checkpoints in output_dir without --resume.
  std::vector<std::string> warnings;
};
absl::StatusOr<JobPlans> TrainingPlans(const nlohmann::json& config);

// `progress` (may be null) gets one line per logged iteration. `executor`
// runs the plan (empty: the actor runtime in this process; see engine.h).
absl::StatusOr<TrainSummary> Train(const nlohmann::json& config, std::FILE* progress = nullptr,
                                   PlanExecutor executor = {});

}  // namespace tessera
