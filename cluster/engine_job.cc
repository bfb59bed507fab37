#include "cluster/engine_job.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "actors/plan.h"
#include "actors/runtime.h"
#include "cluster/transport.h"
#include "core/config.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/text.h"
#include "core/thread_pool.h"
#include "ops/registry.h"
#include "train/checkpoint.h"
#include "train/feeds.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera::cluster {
namespace {

class EngineJobCompiler final : public JobCompiler {
 public:
  absl::StatusOr<JobSpec> Resolve(const std::string& config_json, const std::vector<std::string>& overrides) override {
    nlohmann::json config = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false,
                                                  /*ignore_comments=*/true);
    if (config.is_discarded()) return absl::InvalidArgumentError("the submitted config is not valid JSON");
    if (!config.is_object()) return absl::InvalidArgumentError("the submitted config is not a JSON object");
    if (config.contains("_base_")) {
      return absl::InvalidArgumentError(
          "the submitted config has \"_base_\": the client resolves bases before submitting (tessera submit does)");
    }
    // An override's error names it, as `tessera train`'s do.
    config::Origins origins = {{"", "in the submitted config"}};
    RETURN_IF_ERROR(config::ApplyOverrides(config, overrides, JobSchema(), &origins));
    ASSIGN_OR_RETURN(nlohmann::json resolved, ResolveJobConfig(config, origins));
    RETURN_IF_ERROR(CheckOverridesAreRead(resolved, overrides));
    // A relative path is the master's (docs/cluster.md): made absolute here,
    // so the workers write where the master checks and resumes (from their
    // own directories they wrote elsewhere, and a second run into it was
    // neither refused nor found by --resume), and the run's config.json
    // names the files it read wherever `generate` or `export` runs later.
    for (const auto& [section, key] :
         {std::pair{"train", "output_dir"}, std::pair{"train", "load_weight"}, std::pair{"tokenization", "vocab_file"},
          std::pair{"tokenization", "merges_file"}, std::pair{"dataloader", "data_prefix"},
          std::pair{"dataloader", "text_file"}}) {
      if (!resolved.contains(section) || !resolved[section].is_object() || !resolved[section].contains(key)) continue;
      nlohmann::json& path = resolved[section][key];
      if (!path.is_string() || path.get<std::string>().empty()) continue;  // (the schema refused a NUL)
      // "~/" and "$TESSERA_CACHE/" expanded here too: the master's and the
      // workers' would be the same only by chance (and literal otherwise).
      const std::filesystem::path given = ExpandPath(path.get<std::string>());
      std::error_code ec;
      const std::filesystem::path absolute = std::filesystem::absolute(given, ec);
      if (!ec && (given.is_relative() || given.string() != path.get<std::string>())) {
        // A config is UTF-8 text (JSON, protobuf): a working directory or
        // $HOME that is not would abort whatever writes it.
        const std::string made = absolute.lexically_normal().string();
        if (const std::optional<size_t> bad = FirstInvalidUtf8(made)) {
          return absl::InvalidArgumentError(
              StrCat(section, ".", key, ": '", EscapeControlChars(path.get<std::string>()), "' is '",
                     EscapeControlChars(made, /*non_ascii=*/true), "' here, not valid UTF-8 at byte ", *bad,
                     " (the working directory's or $HOME's): a config holds UTF-8 text, so give a path that is"));
        }
        path = made;
      }
    }
    // Building the job checks what the schema cannot (the mesh, the model's
    // layers, batch arithmetic) before it is queued.
    ASSIGN_OR_RETURN(std::unique_ptr<JobFeed> feed, JobFeed::Make(resolved));
    // What building it derived (train.train_epoch's iterations) goes with
    // the config: into config.json, the plan, the nodes.
    resolved["train"]["train_iter"] = feed->iterations();
    // A directory another run writes now is refused as such first (its
    // checkpoints are that run's, not an earlier one's to resume or replace).
    const std::string output_dir = resolved.at("train").value("output_dir", "");
    if (!feed->train().eval_only && !output_dir.empty()) {
      if (absl::Status free = DirectoryClaim::CheckFree(output_dir); !free.ok()) {
        return absl::Status(free.code(), StrCat("train.output_dir: ", free.message()));
      }
      RETURN_IF_ERROR(CheckNoCheckpointWriters(output_dir));
    }
    // Where it starts (a resume's checkpoint, load_weight's) is checked at
    // submit too, so a missing or finished checkpoint is a submit error.
    ASSIGN_OR_RETURN(const RunStart start,
                     ResolveRunStart(feed->train(), feed->config(), feed->global_batch(), feed->hf_layout()));
    JobSpec spec;
    spec.devices_needed = feed->devices();
    spec.device_type = resolved.at("train").at("dist").at("device_type").get<std::string>();
    // An evaluation-only job's weights may be trained past train_iter: its
    // progress shows their iteration out of at least that many.
    spec.iterations = feed->train().eval_only ? std::max(feed->iterations(), start.iteration) : feed->iterations();
    spec.start_iteration = start.iteration;
    spec.warnings = start.warnings;
    // An evaluation-only job writes nothing: output_dir holds the run whose
    // weights it evaluates.
    spec.output_dir = feed->train().eval_only ? "" : resolved.at("train").value("output_dir", "");
    // The master writes the outputs: the directory must be writable here.
    // So must its checkpoints/ (a cancel writes a checkpoint too): a save
    // that fails after the training is found out now instead.
    if (!spec.output_dir.empty()) {
      RETURN_IF_ERROR(CheckOutputDir(spec.output_dir));
      RETURN_IF_ERROR(CheckOutputDir(CheckpointsDir(spec.output_dir)));
    }
    spec.config = std::move(resolved);
    return spec;
  }

  absl::StatusOr<std::optional<CheckpointMark>> LatestCheckpoint(const JobSpec& spec) override {
    if (spec.output_dir.empty()) return std::optional<CheckpointMark>();
    ASSIGN_OR_RETURN(const std::optional<std::filesystem::path> latest, tessera::LatestCheckpoint(spec.output_dir));
    if (!latest) return std::optional<CheckpointMark>();
    ASSIGN_OR_RETURN(const std::shared_ptr<const CheckpointReader> reader, CheckpointReader::Open(*latest));
    return std::optional<CheckpointMark>(
        CheckpointMark{.iteration = reader->iteration(), .evaluation_pending = reader->evaluation_pending()});
  }

  absl::StatusOr<std::vector<std::string>> Compile(const JobSpec& spec, const std::vector<WorkerSlot>& slots) override {
    std::vector<uint32_t> devices_per_node;
    for (const WorkerSlot& slot : slots) {
      if (slot.num_devices < 1) return absl::InvalidArgumentError(StrCat("worker ", slot.worker_id, " has no devices"));
      devices_per_node.push_back(static_cast<uint32_t>(slot.num_devices));
    }
    ASSIGN_OR_RETURN(std::vector<proto::NodePlan> parts, CompileForNodes(spec.config, devices_per_node));
    std::vector<std::string> out;
    out.reserve(parts.size());
    for (const proto::NodePlan& part : parts) out.push_back(actors::SerializeNodePlan(part));
    return out;
  }
};

// One job's node part. Load parses and binds (cheap, no peers needed); Run
// builds the runtime, which meets the other workers through the KV (every
// worker must have been told to start), and runs it.
class EnginePlanRunner final : public PlanRunner {
 public:
  explicit EnginePlanRunner(EngineRunnerOptions options) : options_(std::move(options)) {}

  absl::Status Load(const RunContext& context, std::string_view node_plan) override {
    context_ = context;
    bytes_ = std::string(node_plan);
    ASSIGN_OR_RETURN(node_plan_, actors::ParseNodePlan(bytes_));
    if (node_plan_.node() != context.node) {
      return absl::InvalidArgumentError(StrCat("the plan is node ", node_plan_.node(), "'s, this worker runs node ",
                                               context.node));
    }
    // (Checked before anything reads it: binding an unchecked plan's
    // sources searched it quadratically, and one that never ran was
    // reported a success.)
    RETURN_IF_ERROR(actors::ValidatePlan(node_plan_.plan(), ops::BuiltinOps()));
    nlohmann::json config = nlohmann::json::parse(node_plan_.job_config(), nullptr, false);
    if (config.is_discarded()) return absl::InvalidArgumentError("the node plan's job config is not valid JSON");
    ASSIGN_OR_RETURN(feed_, JobFeed::Make(config));
    RETURN_IF_ERROR(BindFeeds(node_plan_.plan(), fill_ = feed_->feed(), callbacks_));
    fetch_ = [this](int64_t iteration, const std::map<std::string, Tensor>& values) { return Fetched(iteration, values); };
    eval_fill_ = [this](int64_t batch, int64_t, std::string_view input, const Tensor& out) {
      return feed_->FillEval(batch, input, out);
    };
    eval_fetch_ = [this](int64_t, const std::map<std::string, Tensor>& values) -> absl::Status {
      if (!values.contains("loss")) return absl::OkStatus();
      for (const auto& [name, value] : values) {
        if (value.NumElements() == 1 && value.dtype() == DType::kF32) eval_sums_[name] += value.ToVector<float>().at(0);
      }
      ++eval_batches_seen_;
      return absl::OkStatus();
    };
    return BindFetch(node_plan_.plan(), fetch_, callbacks_);
  }

  // Runs the node's iterations in segments: a runtime per segment, the
  // parameters kept between them (KeptStore), a checkpoint at each segment
  // end that is a checkpoint boundary (train.checkpointer.period, and the
  // last iteration). Every node cuts the same segments (they follow from the
  // config), so each segment's communicators meet under their own KV prefix.
  // A graceful stop (RequestStop, or EngineRunnerOptions::graceful_stop)
  // ends the run at an iteration every node agrees on (AgreeStop), with a
  // checkpoint there.
  absl::Status Run() override {
    const proto::Plan& plan = node_plan_.plan();
    const int64_t first = plan.start_iteration(), end = first + plan.iterations();
    {
      std::lock_guard<std::mutex> lock(mu_);
      next_start_ = first;
    }
    // The first report's rate counts from here (a resumed run's too: not
    // from iteration 0).
    last_reported_ = first - 1;
    int watch = -1;
    if (options_.graceful_stop != nullptr) {
      watch = options_.graceful_stop->Watch([this] { RequestStop(absl::CancelledError("interrupted")); });
    }
    absl::Status status = feed_->train().eval_only ? EvaluateOnly(first) : RunSegments(first, end);
    if (watch >= 0) options_.graceful_stop->Unwatch(watch);
    JoinStopper();
    return status;
  }

  void Cancel(const absl::Status& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    CancelLocked(reason);
  }

  // Starts the agreement on where to stop (once; not after the run ended).
  void RequestStop(const absl::Status& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_requested_ || finished_) return;
    stop_requested_ = true;
    TLOG_INFO("job {} node {}: stopping at an iteration boundary ({})", context_.job_id, context_.node,
              std::string(reason.message()));
    try {
      stop_thread_ = std::thread([this] { AgreeStop(); });
    } catch (const std::exception& e) {  // no thread to agree on (EAGAIN): stopped at once
      CancelLocked(
          absl::ResourceExhaustedError(StrCat("stopping: cannot start a thread (", e.what(), "); stopped at once")));
    }
  }

  ~EnginePlanRunner() override { JoinStopper(); }

 private:
  // Cancel's work, `mu_` held: the first reason stays; a segment still
  // loading stops waiting for its peers, a running one is aborted.
  void CancelLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled_.ok()) cancelled_ = reason.ok() ? absl::CancelledError("the job was cancelled") : reason;
    load_cancel_ = true;
    if (runtime_ != nullptr) runtime_->Abort(cancelled_);
    if (gate_ != nullptr) gate_->Release();
    stop_cv_.notify_all();
  }

  // Ends the stop agreement's thread (it returns at once once finished_).
  void JoinStopper() {
    std::thread stopper;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      stop_cv_.notify_all();
      stopper = std::move(stop_thread_);
    }
    if (stopper.joinable()) stopper.join();
  }

  // Where to stop, agreed with the job's other nodes: this node pauses its
  // gate (no new iteration starts) and posts the highest iteration it has
  // started (global numbering) in the KV; the limit is one past the highest
  // over all nodes, so no node has started an iteration another will not
  // run, and every node computes the same limit from the same answers.
  void AgreeStop() {
    int64_t position = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      position = gate_ != nullptr ? segment_start_ + gate_->Pause() : next_start_ - 1;
    }
    const std::string prefix = StrCat(JobPrefix(), "/stop/");
    const size_t nodes = std::max<size_t>(1, context_.slots.size());
    std::vector<std::string> keys;
    for (size_t n = 0; n < nodes; ++n) keys.push_back(StrCat(prefix, n));
    int64_t limit = position + 1;
    absl::Status status;
    if (nodes > 1) {
      status = context_.kv != nullptr ? context_.kv->Set(StrCat(prefix, context_.node), std::to_string(position))
                                      : absl::FailedPreconditionError("no KV to agree where to stop");
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.stop_agreement_timeout_s);
    while (status.ok() && nodes > 1) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!cancelled_.ok() || finished_) return;
      }
      absl::StatusOr<std::vector<std::string>> answers = context_.kv->Wait(keys, absl::Seconds(1));
      if (answers.ok()) {
        for (const std::string& answer : *answers) {
          int64_t value = 0;
          if (!absl::SimpleAtoi(answer, &value)) {
            status = absl::InternalError(StrCat("a node's stop position '", answer, "' is not a number"));
          }
          limit = std::max(limit, value + 1);
        }
        break;
      }
      if (answers.status().code() != absl::StatusCode::kDeadlineExceeded) {
        status = answers.status();
      } else if (std::chrono::steady_clock::now() > deadline) {
        status = absl::DeadlineExceededError(StrCat("the job's nodes did not agree where to stop within ",
                                                    options_.stop_agreement_timeout_s, " s"));
      }
    }
    if (!status.ok()) {
      Cancel(absl::Status(status.code(), StrCat("stopping: ", status.message(), "; stopped at once")));
      return;
    }
    TLOG_INFO("job {} node {}: had started iteration {}; the nodes stop before {}", context_.job_id, context_.node,
              position, limit);
    std::lock_guard<std::mutex> lock(mu_);
    agreed_limit_ = limit;
    if (gate_ != nullptr) gate_->SetLimit(limit - segment_start_);
    // A segment loading that has no iteration left to run (a node that
    // went on while its peers stopped at the segment's start), or an
    // evaluation loading: nothing loads after this, and a load left to wait
    // for peers who stop failed the job when it timed out.
    if ((gate_ != nullptr && limit <= segment_start_) || evaluating_) load_cancel_ = true;
    // An evaluation changes nothing: one in progress stops here, and the
    // run ends at the iteration it evaluated, with a checkpoint there.
    if (evaluating_ && runtime_ != nullptr) runtime_->Abort(absl::CancelledError("stopped during the evaluation"));
    stop_cv_.notify_all();
  }

  // After a stop request: the agreed limit (waiting for the agreement), or
  // the cancellation that ended the wait. nullopt: no stop requested.
  absl::StatusOr<std::optional<int64_t>> StopLimit() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!stop_requested_) return std::optional<int64_t>();
    stop_cv_.wait(lock, [&] { return agreed_limit_.has_value() || !cancelled_.ok(); });
    if (!cancelled_.ok()) return cancelled_;
    return agreed_limit_;
  }

  // Ends an interrupted run at `iteration`: a checkpoint there (unless
  // nothing was trained, or `saved`: written already), then Cancelled
  // saying where.
  absl::Status Interrupted(int64_t iteration, int64_t first, bool saved = false, bool evaluation_pending = false) {
    const TrainConfig& train = feed_->train();
    if (iteration == first || kept_.empty()) {
      return absl::CancelledError(StrCat("interrupted at iteration ", iteration, " before training; no checkpoint written"));
    }
    if (train.output_dir.empty()) return absl::CancelledError(StrCat("interrupted at iteration ", iteration));
    if (!saved) RETURN_IF_ERROR(SaveCheckpoint(iteration, /*force=*/true, evaluation_pending));
    // (The run's last evaluation cut short: a resume runs only that.)
    const bool final_evaluation = evaluation_pending && iteration >= feed_->iterations();
    return absl::CancelledError(StrCat("interrupted at iteration ", iteration, "; checkpoint ",
                                       CheckpointPath(train.output_dir, iteration).string(),
                                       final_evaluation ? " (its final evaluation was cut short: --resume runs it)"
                                                        : " (--resume continues from it)"));
  }

  absl::Status RunSegments(int64_t first, int64_t end) {
    const TrainConfig& train = feed_->train();
    // Held until this node's part of the run has ended, checkpoint included.
    DirectoryClaim writing;
    if (!train.output_dir.empty()) {
      ASSIGN_OR_RETURN(writing, ClaimCheckpointsDir(train.output_dir));
    }
    absl::Cleanup release = [&writing] { writing.Release(); };
    ReportProgress(first);  // a resumed run starts where its checkpoint is
    // Every job run of a `tessera train` has the same tag (job-000001-1):
    // a temporary directory a killed run left would take this run's shards
    // beside its own (wrong overlaps, a stale file committed).
    if (context_.node == 0 && !train.output_dir.empty()) {
      RETURN_IF_ERROR(RemoveCheckpointTemps(train.output_dir));
      // A run from scratch told to overwrite an earlier run's checkpoints
      // sets them aside now and removes them once it has one of its own: a
      // run that fails first leaves them in checkpoints/.overwritten/.
      overwriting_ = first == 0 && !train.resume && train.overwrite_output_dir;
      if (overwriting_) RETURN_IF_ERROR(SetAsideCheckpoints(train.output_dir));
    }
    LoadBest();
    if (context_.node == 0 && train.load_weight && !node_plan_.init_checkpoint().empty() &&
        !node_plan_.init_weights_only() && context_.report_log) {
      // (It starts the run where there is no checkpoint to continue yet.)
      context_.report_log(StrCat("train.load_weight ", *train.load_weight, " is not read: --resume continues ",
                                 node_plan_.init_checkpoint()));
    }
    std::shared_ptr<const CheckpointReader> init;
    if (!node_plan_.init_checkpoint().empty()) {
      ASSIGN_OR_RETURN(init, CheckpointReader::Open(node_plan_.init_checkpoint(), feed_->hf_layout()));
    }
    // A resume from a checkpoint whose evaluation a stop cut short runs it
    // first (on the checkpoint's weights), so no evaluation goes missing;
    // save_best weighs it (the best checkpoint then shares the checkpoint's
    // files), and the checkpoint is no longer marked. When that was the
    // run's final evaluation, the resume does nothing else (first == end).
    if (init != nullptr && !node_plan_.init_weights_only() && init->evaluation_pending() && train.evaluation.enabled &&
        init->iteration() == first) {
      const absl::Status evaluated = Evaluate(first, /*segment=*/-1, init);
      const bool stopped = !evaluated.ok() && EvaluationStopped();
      if (!evaluated.ok() && !stopped) return evaluated;
      ASSIGN_OR_RETURN(const EvaluationOutcome outcome, ShareEvaluationOutcome(first, stopped));
      if (!outcome.completed) {
        return absl::CancelledError(StrCat("interrupted during the evaluation of ", init->dir().string(),
                                           ", which stays to do (--resume runs it)"));
      }
      RETURN_IF_ERROR(SaveBest(first, outcome.best, init));
      if (context_.node == 0) RETURN_IF_ERROR(ClearEvaluationPending(init->dir()));
    }
    // Segments end where a checkpoint or an evaluation is due.
    const int64_t checkpoint_period = train.checkpointer.period.value_or(end);
    const int64_t eval_period = train.evaluation.eval_period.value_or(end);
    int segment = 0;
    int64_t saved = -1;  // the iteration of the last checkpoint this run wrote
    for (int64_t start = first; start < end; ++segment) {
      ASSIGN_OR_RETURN(const std::optional<int64_t> limit, StopLimit());
      if (limit && start >= *limit) return Interrupted(start, first, /*saved=*/saved == start);
      const int64_t stop = std::min({end, (start / checkpoint_period + 1) * checkpoint_period,
                                     (start / eval_period + 1) * eval_period});
      proto::NodePlan part = node_plan_;
      part.clear_eval();
      part.mutable_plan()->set_start_iteration(start);
      part.mutable_plan()->set_iterations(stop - start);
      actors::RuntimeOptions options = RuntimeOptionsFor(StrCat("s", segment));
      options.callbacks = callbacks_;
      if (segment == 0 && init != nullptr) {
        RETURN_IF_ERROR(BindCheckpointInitializers(part.plan(), init, node_plan_.init_weights_only(),
                                                   ops::BuiltinOps(), options.callbacks));
      }
      kept_.Bind(part.plan(), options.callbacks);
      // The segment's gate: a stop requested from now on pauses it while
      // the nodes agree (AgreeStop), one agreed already limits it.
      actors::IterationGate gate;
      options.gate = &gate;
      {
        std::lock_guard<std::mutex> lock(mu_);
        // (A stop agreed since StopLimit, where this segment starts: none
        // of its iterations runs, and its peers do not load it.)
        if (agreed_limit_ && start >= *agreed_limit_) {
          gate_ = nullptr;
        } else {
          gate_ = &gate;
          segment_start_ = start;
          if (agreed_limit_) {
            gate.SetLimit(*agreed_limit_ - start);
          } else if (stop_requested_) {
            gate.Pause();
          }
        }
      }
      if (gate_ == nullptr) return Interrupted(start, first, /*saved=*/saved == start);
      absl::Status ran = RunSegment(actors::SerializeNodePlan(part), std::move(options));
      bool stopped_before = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        gate_ = nullptr;
        next_start_ = gate.limit() ? std::min(stop, start + *gate.limit()) : stop;
        stopped_before = cancelled_.ok() && agreed_limit_ && start >= *agreed_limit_;
      }
      // A load the agreed stop ended (AgreeStop: the segment had no
      // iteration to run), or its peers' leaving: the run ends where it is.
      if (!ran.ok() && stopped_before) return Interrupted(start, first, /*saved=*/saved == start);
      RETURN_IF_ERROR(ran);
      if (gate.limit() && start + *gate.limit() < stop) {
        return Interrupted(start + *gate.limit(), first, /*saved=*/saved == start + *gate.limit());
      }
      ReportProgress(stop);
      const bool last = stop == end;
      if (last || stop % eval_period == 0) {
        const absl::Status evaluated = Evaluate(stop, segment);
        const bool stopped = !evaluated.ok() && EvaluationStopped();
        if (!evaluated.ok() && !stopped) return evaluated;
        ASSIGN_OR_RETURN(const EvaluationOutcome outcome, ShareEvaluationOutcome(stop, stopped));
        if (!outcome.completed) {
          return Interrupted(stop, first, /*saved=*/saved == stop, /*evaluation_pending=*/true);
        }
        RETURN_IF_ERROR(SaveBest(stop, outcome.best));
      }
      if (last || stop % checkpoint_period == 0) {
        RETURN_IF_ERROR(SaveCheckpoint(stop));
        saved = stop;
      }
      start = stop;
    }
    return absl::OkStatus();
  }

  // The options every runtime of the job shares (without callbacks); its
  // communicators and bus links meet under "<job prefix>/<name>" in the KV,
  // a name per segment or evaluation.
  actors::RuntimeOptions RuntimeOptionsFor(const std::string& name) const {
    actors::RuntimeOptions options;
    options.kv = context_.kv;
    options.kv_prefix = StrCat(JobPrefix(), "/", name);
    options.bus_token = context_.token;
    // gloo listens on this worker's data-plane host (`--data-address`), else
    // on the runner's default.
    options.hostname = options_.hostname;
    for (const WorkerSlot& slot : context_.slots) {
      if (slot.node != context_.node || slot.data_address.empty()) continue;
      options.hostname = DataHostName(slot.data_address);
    }
    options.connect_timeout_s = options_.connect_timeout_s;
    options.stall_timeout_s = options_.stall_timeout_s;
    options.load_cancel = &load_cancel_;
    return options;
  }

  std::string JobPrefix() const { return StrCat("job/", context_.job_id, "/", context_.session); }

  // One segment: the node plan `bytes` in a runtime with this node's
  // intra-op pools, abortable by Cancel.
  absl::Status RunSegment(const std::string& bytes, actors::RuntimeOptions options) {
    // Each device of this node gets its share of the machine's threads.
    std::vector<uint32_t> devices;
    for (const auto& rank : node_plan_.plan().ranks()) {
      if (rank.node() == node_plan_.node()) devices.push_back(rank.device_index());
    }
    // The job's train.dist.intra_op_threads first, then the worker's.
    const int configured = feed_->intra_op_threads() > 0 ? feed_->intra_op_threads() : options_.intra_op_threads;
    const int threads = configured > 0 ? configured
                                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                                         std::max(1, static_cast<int>(devices.size())));
    if (threads > 1 && pools_.empty()) {
      for (uint32_t device : devices) pools_[device] = std::make_unique<ThreadPool>(threads);
    }
    for (const auto& [device, pool] : pools_) options.device_pools[device] = pool.get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_.ok()) return cancelled_;
      if (evaluating_ && agreed_limit_) return absl::CancelledError("stopped before the evaluation");
    }
    last_report_ = std::chrono::steady_clock::now();
    auto runtime = actors::Runtime::LoadNodePlan(bytes, std::move(options));
    if (!runtime.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      return cancelled_.ok() ? runtime.status() : cancelled_;  // a stop ends the load: its reason
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_.ok()) return cancelled_;
      if (evaluating_ && agreed_limit_) return absl::CancelledError("stopped before the evaluation");
      runtime_ = runtime->get();
    }
    absl::Status status = (*runtime)->Run();
    {
      std::lock_guard<std::mutex> lock(mu_);
      runtime_ = nullptr;
    }
    return status;
  }

  // train.eval_only: one evaluation of the start checkpoint's weights
  // (ResolveRunStart's), trained to `iteration`; no training segment.
  absl::Status EvaluateOnly(int64_t iteration) {
    if (node_plan_.init_checkpoint().empty()) {
      return absl::FailedPreconditionError("train.eval_only: the plan names no checkpoint to evaluate");
    }
    ASSIGN_OR_RETURN(std::shared_ptr<const CheckpointReader> weights,
                     CheckpointReader::Open(node_plan_.init_checkpoint(), feed_->hf_layout()));
    const absl::Status evaluated = Evaluate(iteration, 0, weights);
    if (!evaluated.ok() && EvaluationStopped()) return absl::CancelledError("interrupted during the evaluation");
    return evaluated;
  }

  // Whether an evaluation that failed was stopped by the agreed stop (this
  // node's abort, or a peer's, which this node's agreement follows).
  bool EvaluationStopped() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stop_requested_) return false;
    }
    const absl::StatusOr<std::optional<int64_t>> limit = StopLimit();
    return limit.ok() && limit->has_value();
  }

  // The held-out loss after the segment ending at `iteration`: the node's
  // part of the evaluation plan over eval_batches() batches, its variables
  // copied from the trained values (or read from `weights`); the node
  // holding the sink reports eval_loss, eval_ppl and the unigram baseline's
  // unigram_ppl.
  absl::Status Evaluate(int64_t iteration, int segment, std::shared_ptr<const CheckpointReader> weights = nullptr) {
    if (!node_plan_.has_eval() || feed_->eval_batches() == 0) return absl::OkStatus();
    proto::NodePlan part = node_plan_.eval();
    part.mutable_plan()->set_start_iteration(0);
    part.mutable_plan()->set_iterations(feed_->eval_batches());
    actors::RuntimeOptions options = RuntimeOptionsFor(StrCat("e", segment));
    RETURN_IF_ERROR(BindFeeds(part.plan(), eval_fill_, options.callbacks));
    RETURN_IF_ERROR(BindFetch(part.plan(), eval_fetch_, options.callbacks));
    if (weights != nullptr) {
      RETURN_IF_ERROR(BindCheckpointInitializers(part.plan(), weights, /*weights_only=*/true, ops::BuiltinOps(),
                                                 options.callbacks));
    } else {
      RETURN_IF_ERROR(kept_.BindVariables(part.plan(), options.callbacks));
    }
    eval_sums_.clear();
    eval_batches_seen_ = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      evaluating_ = true;
    }
    const absl::Status ran = RunSegment(actors::SerializeNodePlan(part), std::move(options));
    {
      std::lock_guard<std::mutex> lock(mu_);
      evaluating_ = false;
    }
    RETURN_IF_ERROR(ran);
    if (eval_batches_seen_ == 0) return absl::OkStatus();  // another node holds the sink
    JobMetrics metrics;
    metrics.iteration = iteration;
    ASSIGN_OR_RETURN(metrics.values, EvalMetrics(eval_sums_, eval_batches_seen_, feed_->eval_loss_terms(),
                                                 feed_->reports_perplexity()));
    if (const auto* text = feed_->text(); text != nullptr) {
      if (const std::optional<double> unigram = text->unigram_valid_loss(feed_->eval_samples())) {
        metrics.values["unigram_ppl"] = std::exp(*unigram);
      }
    }
    last_eval_ = metrics.values;
    if (context_.report_metrics) context_.report_metrics(metrics);
    return absl::OkStatus();
  }

  // After the segment ending at `iteration`: when it is a checkpoint
  // boundary, this node writes its ranks' shards into the checkpoint's
  // temporary directory and says so in the KV; node 0 waits for every
  // node, then commits (index.json, rename) and prunes old checkpoints.
  absl::Status SaveCheckpoint(int64_t iteration, bool force = false, bool evaluation_pending = false) {
    const TrainConfig& train = feed_->train();
    const int64_t end = node_plan_.plan().start_iteration() + node_plan_.plan().iterations();
    const bool due = force || iteration == end ||
                     (train.checkpointer.period && iteration % *train.checkpointer.period == 0);
    if (!due || train.output_dir.empty()) return absl::OkStatus();
    const std::string tag = StrCat(context_.job_id, "-", context_.session);
    const std::filesystem::path final_dir = CheckpointPath(train.output_dir, iteration);
    CheckpointState state{.iteration = iteration,
                          .global_batch = feed_->global_batch(),
                          .config = feed_->config(),
                          .best = nullptr,
                          .evaluation_pending = evaluation_pending};
    ASSIGN_OR_RETURN(const bool committed,
                     WriteAndCommit(CheckpointTempPath(train.output_dir, iteration, tag), final_dir, state,
                                    StrCat(JobPrefix(), "/checkpoint/", iteration, "/")));
    if (!committed) return absl::OkStatus();
    // (Noted before older ones are pruned: a second Ctrl-C names one that
    // is there.)
    NoteCommittedCheckpoint(final_dir);
    if (overwriting_) {
      RETURN_IF_ERROR(RemoveSetAsideCheckpoints(train.output_dir));
      overwriting_ = false;
    }
    RETURN_IF_ERROR(PruneCheckpoints(train.output_dir, train.checkpointer.max_to_keep, tag));
    if (context_.report_log) context_.report_log(StrCat("saved checkpoint ", final_dir.string()));
    return absl::OkStatus();
  }

  // Whether this node's part of the evaluation plan holds its sink (the
  // plan has one): the node that reports the evaluation's metrics.
  bool HoldsEvaluationSink() const {
    if (!node_plan_.has_eval()) return false;
    const auto& tasks = node_plan_.eval().plan().tasks();
    return std::any_of(tasks.begin(), tasks.end(),
                       [](const proto::Task& task) { return task.kind() == proto::ACTOR_KIND_SINK; });
  }

  struct EvaluationOutcome {
    bool completed = true;  // false: the agreed stop cut it short
    std::string best;       // save_best: the improved eval_metric as JSON; empty: none
  };

  // After the evaluation at `iteration` (`stopped`: this node's part was
  // ended by the agreed stop): whether it completed and, with save_best,
  // whether it beat every earlier one. The sink's node decides; on several
  // nodes it posts the outcome in the KV and the others wait for it. A
  // node's own part says nothing of the whole: one done with its part
  // belongs to an evaluation the stop cut short at the sink (it waited for
  // a save_best decision that never came, and committed the checkpoint
  // without its evaluation pending), and one stopped after its last batch
  // to one the sink completed.
  absl::StatusOr<EvaluationOutcome> ShareEvaluationOutcome(int64_t iteration, bool stopped) {
    EvaluationOutcome outcome;
    if (!node_plan_.has_eval() || feed_->eval_batches() == 0) return outcome;
    const TrainConfig& train = feed_->train();
    const EvaluationConfig& eval = train.evaluation;
    const size_t nodes = std::max<size_t>(1, context_.slots.size());
    const bool shared = context_.kv != nullptr && nodes > 1;
    const std::string key = StrCat(JobPrefix(), "/evaluated/", iteration);
    if (!HoldsEvaluationSink()) {
      if (!shared) return absl::InternalError("the evaluation plan has no sink");
      ASSIGN_OR_RETURN(const std::vector<std::string> values, WaitForKeys({key}));
      outcome.completed = values.at(0) != "stopped";
      if (outcome.completed && values.at(0) != "-") outcome.best = values.at(0);
      return outcome;
    }
    outcome.completed = !stopped;
    if (outcome.completed && train.checkpointer.save_best && eval_batches_seen_ > 0) {
      const auto it = last_eval_.find(eval.eval_metric);
      if (it == last_eval_.end()) {
        return absl::InternalError(StrCat("the evaluation reported no ", eval.eval_metric));
      }
      const double value = it->second;
      if (std::isfinite(value) && (!best_ || (eval.eval_mode == "min" ? value < *best_ : value > *best_))) {
        best_ = value;
        outcome.best = nlohmann::json(value).dump();
      }
    }
    if (shared) {
      RETURN_IF_ERROR(context_.kv->Set(key, !outcome.completed     ? "stopped"
                                            : outcome.best.empty() ? "-"
                                                                   : outcome.best));
    }
    return outcome;
  }

  // After the evaluation at `iteration`, with train.checkpointer.save_best:
  // when its eval_metric improves on every earlier one of the run (a resumed
  // run's included: the best checkpoint's), every node writes its shards
  // and node 0 commits them as output_dir/checkpoints/best. The node holding
  // the evaluation's sink decides and posts the decision in the KV.
  // `from`: the committed checkpoint whose weights were evaluated (a
  // resume's redone evaluation), whose files node 0 links as the best one;
  // else every node writes its shards of the kept values.
  absl::Status SaveBest(int64_t iteration, const std::string& decision,
                        const std::shared_ptr<const CheckpointReader>& from = nullptr) {
    const TrainConfig& train = feed_->train();
    if (!train.checkpointer.save_best || train.output_dir.empty() || decision.empty()) return absl::OkStatus();
    const EvaluationConfig& eval = train.evaluation;
    const nlohmann::json value = nlohmann::json::parse(decision, nullptr, false);
    if (!value.is_number()) return absl::InternalError(StrCat("save_best: the decision '", decision, "' is no number"));
    CheckpointState state{.iteration = iteration,
                          .global_batch = feed_->global_batch(),
                          .config = feed_->config(),
                          .best = {{"metric", eval.eval_metric}, {"mode", eval.eval_mode}, {"value", value}}};
    const std::string tag = StrCat(context_.job_id, "-", context_.session, "-best");
    const std::filesystem::path final_dir = BestCheckpointPath(train.output_dir);
    const std::filesystem::path temp = CheckpointTempPath(train.output_dir, iteration, tag);
    bool committed = false;
    if (from != nullptr) {
      // (Its every rank file is there already: node 0 alone commits.)
      if (context_.node != 0) return absl::OkStatus();
      absl::Status linked = LinkCheckpointShards(from->dir(), temp);
      if (linked.ok()) linked = CommitCheckpoint(temp, final_dir, state);
      if (!linked.ok()) {
        std::error_code ec;
        std::filesystem::remove_all(temp, ec);
        return linked;
      }
      committed = true;
    } else {
      ASSIGN_OR_RETURN(committed,
                       WriteAndCommit(temp, final_dir, state, StrCat(JobPrefix(), "/best/", iteration, "/")));
    }
    if (committed && context_.report_log) {
      context_.report_log(StrCat("saved best checkpoint ", final_dir.string(), " (iteration ", iteration, ", ",
                                 eval.eval_metric, " ", decision, ")"));
    }
    return absl::OkStatus();
  }

  // The best eval_metric so far of the run this one resumes: its best
  // checkpoint's, when that one compared the same metric the same way.
  void LoadBest() {
    const TrainConfig& train = feed_->train();
    if (!train.checkpointer.save_best || train.output_dir.empty()) return;
    if (node_plan_.plan().start_iteration() == 0 || node_plan_.init_weights_only()) return;  // not a resume
    const std::filesystem::path dir = BestCheckpointPath(train.output_dir);
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec)) return;
    auto reader = CheckpointReader::Open(dir);
    if (!reader.ok()) {
      // Replaced by the next evaluation's, whatever its value: said (by node
      // 0), as it went silently (a better model's weights overwritten by a
      // worse one's).
      if (context_.node == 0 && context_.report_log) {
        context_.report_log(StrCat("the best checkpoint ", dir.string(), " is damaged (", reader.status().message(),
                                   "): the next evaluation's checkpoint replaces it"));
      }
      return;
    }
    const nlohmann::json& best = (*reader)->best();
    if (best.is_object() && best.value("metric", "") == train.evaluation.eval_metric &&
        best.value("mode", "") == train.evaluation.eval_mode && best.contains("value") && best["value"].is_number()) {
      best_ = best["value"].get<double>();
    }
  }

  // Every node writes its ranks' shards of the kept values into `temp` and
  // says so under `done_key` in the KV; node 0 waits for every node, then
  // commits `temp` as `final_dir` with `state`. Whether this node committed.
  absl::StatusOr<bool> WriteAndCommit(const std::filesystem::path& temp, const std::filesystem::path& final_dir,
                                      const CheckpointState& state, const std::string& done_key) {
    const size_t nodes = std::max<size_t>(1, context_.slots.size());
    if (absl::Status written = WriteCheckpointShards(temp, node_plan_.plan(), kept_.values()); !written.ok()) {
      // A write that failed (a full disk) leaves no temporary directory
      // behind where this node is the job's only one (others may still
      // write theirs there: the next run's node 0 removes it).
      std::error_code ec;
      if (nodes == 1) std::filesystem::remove_all(temp, ec);
      return written;
    }
    const bool shared = context_.kv != nullptr && nodes > 1;
    if (shared) RETURN_IF_ERROR(context_.kv->Set(StrCat(done_key, context_.node), "written"));
    if (context_.node != 0) return false;
    if (shared) {
      std::vector<std::string> keys;
      for (size_t n = 0; n < nodes; ++n) keys.push_back(StrCat(done_key, n));
      RETURN_IF_ERROR(WaitForKeys(keys).status());
    }
    if (absl::Status committed = CommitCheckpoint(temp, final_dir, state); !committed.ok()) {
      // (index.json on a full disk, a failed rename: every node has written
      // its shards, so the temporary directory is nobody's now. It was
      // left behind, rank files and all.)
      std::error_code ec;
      std::filesystem::remove_all(temp, ec);
      return committed;
    }
    return true;
  }

  // `keys`' values in the KV once all are set; short waits, so that a cancel
  // is noticed while a peer still works.
  absl::StatusOr<std::vector<std::string>> WaitForKeys(const std::vector<std::string>& keys) {
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!cancelled_.ok()) return cancelled_;
      }
      auto waited = context_.kv->Wait(keys, absl::Seconds(1));
      if (waited.ok()) return waited;
      if (waited.status().code() != absl::StatusCode::kDeadlineExceeded) return waited.status();
    }
  }

  // This node has completed `iteration` iterations (the heartbeats carry it).
  void ReportProgress(int64_t iteration) const {
    if (context_.report_progress) context_.report_progress(iteration);
  }

  // The sink's node reports what `tessera train` writes to metrics.jsonl,
  // every log_period iterations and the last.
  absl::Status Fetched(int64_t iteration, const std::map<std::string, Tensor>& values) {
    auto loss = values.find("loss");
    if (loss == values.end()) return absl::OkStatus();
    const double value = loss->second.ToVector<float>().at(0);
    // (Iterations counted from 1, as the progress lines and metrics.jsonl.)
    if (!std::isfinite(value)) return absl::InternalError(StrCat("loss is ", value, " at iteration ", iteration + 1));
    ReportProgress(iteration + 1);
    // fp16 loss scaling: the steps skipped so far, beside each record's flag.
    if (auto it = values.find("skipped"); it != values.end()) skipped_steps_ += it->second.ToVector<float>().at(0) != 0;
    if ((iteration + 1) % feed_->log_period() != 0 && iteration + 1 != feed_->iterations()) return absl::OkStatus();
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_report_).count();
    const double samples = static_cast<double>((iteration - last_reported_) * feed_->global_batch());
    last_report_ = now;
    last_reported_ = iteration;
    JobMetrics metrics;
    metrics.iteration = iteration + 1;
    metrics.values["loss"] = value;
    metrics.values["lr"] = feed_->lr(iteration);
    // grad_norm and the model's other scalar fetches (e.g. BERT's mlm_loss).
    for (const auto& [name, tensor] : values) {
      if (name != "loss" && tensor.NumElements() == 1 && tensor.dtype() == DType::kF32) {
        metrics.values[name] = tensor.ToVector<float>().at(0);
      }
    }
    if (values.contains("skipped")) metrics.values["skipped_steps"] = static_cast<double>(skipped_steps_);
    metrics.values["samples_per_s"] = seconds > 0 ? samples / seconds : 0.0;
    if (feed_->tokens_per_sample() > 0) {
      metrics.values["tokens_per_s"] = metrics.values["samples_per_s"] * static_cast<double>(feed_->tokens_per_sample());
    }
    if (context_.report_metrics) context_.report_metrics(metrics);
    return absl::OkStatus();
  }

  const EngineRunnerOptions options_;
  RunContext context_;
  std::string bytes_;
  proto::NodePlan node_plan_;
  std::unique_ptr<JobFeed> feed_;
  FeedFn fill_;
  FetchFn fetch_;
  FeedFn eval_fill_;
  FetchFn eval_fetch_;
  std::map<std::string, double> eval_sums_;  // written by the sink's thread during an evaluation, read after it
  int64_t eval_batches_seen_ = 0;
  std::map<std::string, double> last_eval_;  // the sink's node: the last evaluation's metrics
  std::optional<double> best_;               // the sink's node: the best eval_metric so far (save_best)
  // Node 0: train.overwrite_output_dir's earlier checkpoints are still set
  // aside (removed at this run's first commit).
  bool overwriting_ = false;
  actors::HostCallbacks callbacks_;
  KeptStore kept_;
  std::map<uint32_t, std::unique_ptr<ThreadPool>> pools_;  // per device, made by the first segment
  std::chrono::steady_clock::time_point last_report_;
  int64_t last_reported_ = -1;
  int64_t skipped_steps_ = 0;  // fp16 loss scaling: steps skipped so far
  std::mutex mu_;
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> load_cancel_{false};  // set with cancelled_; read by loading runtimes
  actors::Runtime* runtime_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The graceful stop (AgreeStop).
  std::condition_variable stop_cv_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool evaluating_ ABSL_GUARDED_BY(mu_) = false;  // the runtime_ running is an evaluation's
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Run returned (or the runner is going)
  std::thread stop_thread_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> agreed_limit_ ABSL_GUARDED_BY(mu_);  // global: the run ends before this iteration
  actors::IterationGate* gate_ ABSL_GUARDED_BY(mu_) = nullptr;  // the training segment's, while it runs
  int64_t segment_start_ ABSL_GUARDED_BY(mu_) = 0;  // that segment's first iteration
  int64_t next_start_ ABSL_GUARDED_BY(mu_) = 0;  // without a gate: the next iteration to start
};

}  // namespace

// Watchers run under mu_, so one that Unwatch returned from never runs
// again (its runner may be gone).
void GracefulStop::Request() {
  std::lock_guard<std::mutex> lock(mu_);
  if (requested_) return;
  requested_ = true;
  for (auto& [id, fn] : watchers_) fn();
}

bool GracefulStop::requested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requested_;
}

int GracefulStop::Watch(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  const int id = next_id_++;
  if (requested_) fn();
  watchers_[id] = std::move(fn);
  return id;
}

void GracefulStop::Unwatch(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(id);
}

std::unique_ptr<JobCompiler> MakeEngineJobCompiler() { return std::make_unique<EngineJobCompiler>(); }

PlanRunnerFactory MakeEnginePlanRunnerFactory(EngineRunnerOptions options) {
  return [options]() -> std::unique_ptr<PlanRunner> { return std::make_unique<EnginePlanRunner>(options); };
}

}  // namespace tessera::cluster
