#include "cluster/engine_job.h"

#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "actors/plan.h"
#include "actors/runtime.h"
#include "core/config.h"
#include "core/status.h"
#include "core/text.h"
#include "core/thread_pool.h"
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
    RETURN_IF_ERROR(config::ApplyOverrides(config, overrides, JobSchema()));
    ASSIGN_OR_RETURN(nlohmann::json resolved, ResolveJobConfig(config, "in the submitted config"));
    // Building the job checks what the schema cannot (the mesh, the model's
    // layers, batch arithmetic) before it is queued.
    ASSIGN_OR_RETURN(std::unique_ptr<JobFeed> feed, JobFeed::Make(resolved));
    JobSpec spec;
    spec.devices_needed = feed->devices();
    spec.iterations = feed->iterations();
    spec.output_dir = resolved.at("train").value("output_dir", "");
    // The master writes the outputs: the directory must be writable here.
    if (!spec.output_dir.empty()) RETURN_IF_ERROR(CheckOutputDir(spec.output_dir));
    spec.config = std::move(resolved);
    return spec;
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
    nlohmann::json config = nlohmann::json::parse(node_plan_.job_config(), nullptr, false);
    if (config.is_discarded()) return absl::InvalidArgumentError("the node plan's job config is not valid JSON");
    ASSIGN_OR_RETURN(feed_, JobFeed::Make(config));
    RETURN_IF_ERROR(BindFeeds(node_plan_.plan(), fill_ = feed_->feed(), callbacks_));
    fetch_ = [this](int64_t iteration, const std::map<std::string, Tensor>& values) { return Fetched(iteration, values); };
    return BindFetch(node_plan_.plan(), fetch_, callbacks_);
  }

  absl::Status Run() override {
    actors::RuntimeOptions options;
    options.callbacks = callbacks_;
    options.kv = context_.kv;
    options.kv_prefix = StrCat("job/", context_.job_id, "/", context_.session);
    options.bus_token = context_.token;
    // gloo listens on this worker's data-plane host (`--data-address`), else
    // on the runner's default.
    options.hostname = options_.hostname;
    for (const WorkerSlot& slot : context_.slots) {
      if (slot.node != context_.node || slot.data_address.empty()) continue;
      const size_t colon = slot.data_address.rfind(':');
      options.hostname = colon == std::string::npos ? slot.data_address : slot.data_address.substr(0, colon);
    }
    options.connect_timeout_s = options_.connect_timeout_s;
    options.stall_timeout_s = options_.stall_timeout_s;
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
    std::vector<std::unique_ptr<ThreadPool>> pools;
    if (threads > 1) {
      for (uint32_t device : devices) {
        pools.push_back(std::make_unique<ThreadPool>(threads));
        options.device_pools[device] = pools.back().get();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_.ok()) return cancelled_;
    }
    last_report_ = std::chrono::steady_clock::now();
    auto runtime = actors::Runtime::LoadNodePlan(bytes_, std::move(options));
    if (!runtime.ok()) return runtime.status();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_.ok()) return cancelled_;
      runtime_ = runtime->get();
    }
    absl::Status status = (*runtime)->Run();
    {
      std::lock_guard<std::mutex> lock(mu_);
      runtime_ = nullptr;
    }
    return status;
  }

  void Cancel(const absl::Status& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_.ok()) cancelled_ = reason.ok() ? absl::CancelledError("the job was cancelled") : reason;
    if (runtime_ != nullptr) runtime_->Abort(cancelled_);
  }

 private:
  // The sink's node reports what `tessera train` writes to metrics.jsonl,
  // every log_period iterations and the last.
  absl::Status Fetched(int64_t iteration, const std::map<std::string, Tensor>& values) {
    auto loss = values.find("loss");
    if (loss == values.end()) return absl::OkStatus();
    const double value = loss->second.ToVector<float>().at(0);
    if (!std::isfinite(value)) return absl::InternalError(StrCat("loss is ", value, " at iteration ", iteration));
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
    if (auto norm = values.find("grad_norm"); norm != values.end()) {
      metrics.values["grad_norm"] = norm->second.ToVector<float>().at(0);
    }
    metrics.values["samples_per_s"] = seconds > 0 ? samples / seconds : 0.0;
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
  actors::HostCallbacks callbacks_;
  std::chrono::steady_clock::time_point last_report_;
  int64_t last_reported_ = -1;
  std::mutex mu_;
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  actors::Runtime* runtime_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace

std::unique_ptr<JobCompiler> MakeEngineJobCompiler() { return std::make_unique<EngineJobCompiler>(); }

PlanRunnerFactory MakeEnginePlanRunnerFactory(EngineRunnerOptions options) {
  return [options]() -> std::unique_ptr<PlanRunner> { return std::make_unique<EnginePlanRunner>(options); };
}

}  // namespace tessera::cluster
