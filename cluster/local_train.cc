#include "cluster/local_train.h"

#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cluster/client.h"
#include "cluster/engine_job.h"
#include "cluster/master.h"
#include "cluster/worker.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/storage.h"
#include "core/text.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace tessera::cluster {
namespace {

constexpr char kWorkerId[] = "local";

// 128 random bits, hex: nobody else on this machine can drive the daemons.
std::string RandomToken() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&token, "%08x", device());
  return token;
}

// The worker's failure as it reported it: the master's reason is
// "worker local (node 0): CODE: message", or "WHY IT WAS STOPPING; while
// stopping, worker local (node 0): CODE: message" (the words about the
// one worker of this process dropped, the rest kept).
absl::Status JobError(const control::JobInfo& info) {
  std::string reason = info.reason();
  const std::string prefix = absl::StrCat("worker ", kWorkerId, " (node 0): ");
  const size_t at = reason.find(prefix);
  if (at == std::string::npos) return absl::InternalError(reason);
  std::string message = reason.substr(at + prefix.size());
  absl::StatusCode status_code = absl::StatusCode::kInternal;
  for (int code = 1; code <= 16; ++code) {
    const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code)) + ": ";
    if (message.starts_with(name)) {
      status_code = static_cast<absl::StatusCode>(code);
      message.erase(0, name.size());
      break;
    }
  }
  return absl::Status(status_code, reason.substr(0, at) + message);
}

}  // namespace

absl::Status TrainOnThisMachine(const nlohmann::json& config, std::FILE* progress,
                                std::shared_ptr<GracefulStop> stop) {
  // The master's own checks first, so a bad config starts nothing.
  ASSIGN_OR_RETURN(const JobSpec spec, MakeEngineJobCompiler()->Resolve(config.dump(), {}));
  // GPUs: this machine must have them before anything starts or is written.
  const bool gpus = spec.config.at("train").at("dist").at("device_type") == "cuda";
  if (gpus) {
    // What the plan refuses (an op without a CUDA kernel) before what the
    // machine lacks.
    RETURN_IF_ERROR(TrainingPlan(spec.config).status());
    const absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) return absl::FailedPreconditionError(StrCat("train.dist.device_type=cuda: ", count.status().message()));
    if (*count < spec.devices_needed) {
      return absl::FailedPreconditionError(StrCat("train.dist.device_type=cuda: the job needs ", spec.devices_needed,
                                                  " GPUs, this machine has ", *count));
    }
  }
  Security security;
  security.token = RandomToken();

  Master::Options master_options;
  master_options.listen = "127.0.0.1:0";
  master_options.security = security;
  master_options.warn_on_job_failure = false;  // the reason is returned
  Master master(master_options, MakeEngineJobCompiler());
  ASSIGN_OR_RETURN(const std::string address, master.Start());

  Worker::Options worker_options;
  worker_options.master = address;
  worker_options.devices = gpus ? absl::StrCat("cuda:0-", spec.devices_needed - 1) : absl::StrCat("cpu:", spec.devices_needed);
  worker_options.worker_id = kWorkerId;
  worker_options.security = security;
  Worker worker(worker_options, MakeEnginePlanRunnerFactory({.graceful_stop = std::move(stop)}));
  RETURN_IF_ERROR(worker.Start().status());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!worker.registered()) {
    if (std::chrono::steady_clock::now() > until) {
      return absl::DeadlineExceededError("the in-process worker did not register with the in-process master in 30 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

  Client::Options client_options;
  client_options.master = address;
  client_options.security = security;
  Client client(client_options);
  const auto started = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const std::string job, client.Submit(config.dump(), {}));
  double final_loss = 0;
  const bool eval_only = spec.config.at("train").value("eval_only", false);
  int64_t evaluated = 0;  // the iteration of the last evaluation
  std::unique_ptr<ProgressDisplay> display;
  if (progress != nullptr) {
    ProgressDisplay::Options options;
    options.total_iterations = spec.iterations;
    options.start_iteration = spec.start_iteration;
    options.log_period = config.at("train").value("log_period", int64_t{1});
    options.columns = TerminalColumns(progress);
    options.eval_only = eval_only;
    display = std::make_unique<ProgressDisplay>(progress, ::isatty(::fileno(progress)) == 1, options);
  }
  RETURN_IF_ERROR(client.Watch(job, [&](const control::JobEvent& event) {
    if (display != nullptr && event.has_log_line()) {
      const std::string& line = event.log_line();
      // The runner's own notes (a checkpoint saved, a train.load_weight a
      // resume does not read, a damaged best checkpoint replaced; only
      // the first two reached the user); the master's and errors reach the
      // user through the job's result.
      if (line.starts_with("[node ")) display->Line(line);
    }
    if (!event.has_metrics()) return true;
    const auto& values = event.metrics().values();
    const auto value = [&](const char* key) -> std::optional<double> {
      auto it = values.find(key);
      return it == values.end() ? std::nullopt : std::optional<double>(it->second);
    };
    if (value("eval_loss")) {
      evaluated = event.metrics().iteration();
      if (display == nullptr) return true;
      std::vector<std::pair<std::string, double>> eval = {{"loss", *value("eval_loss")}};
      if (value("eval_ppl")) eval.emplace_back("ppl", *value("eval_ppl"));
      // BERT's parts of the loss (eval_mlm_loss, eval_nsp_loss), then its
      // accuracies (eval_mlm_accuracy, eval_nsp_accuracy), each by name.
      std::map<std::string, double> parts, accuracies;
      for (const auto& [name, v] : values) {
        if (!name.starts_with("eval_") || name == "eval_loss") continue;
        if (name.ends_with("_loss")) parts[name.substr(5)] = v;
        if (name.ends_with("_accuracy")) accuracies[name.substr(5)] = v;
      }
      eval.insert(eval.end(), parts.begin(), parts.end());
      eval.insert(eval.end(), accuracies.begin(), accuracies.end());
      if (value("unigram_ppl")) eval.emplace_back("unigram_ppl", *value("unigram_ppl"));
      display->Eval(event.metrics().iteration(), eval);
      return true;
    }
    final_loss = value("loss").value_or(0.0);
    if (display != nullptr) {
      display->Update(IterationStats{.iteration = event.metrics().iteration(),
                                     .total = spec.iterations,
                                     .loss = final_loss,
                                     .lr = value("lr").value_or(0.0),
                                     .grad_norm = value("grad_norm"),
                                     .tokens_per_s = value("tokens_per_s"),
                                     .samples_per_s = value("samples_per_s")});
    }
    return true;
  }));
  if (display != nullptr) display->Finish();
  ASSIGN_OR_RETURN(const control::JobInfo info, client.Get(job));
  if (info.state() != control::SUCCEEDED) return JobError(info);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (eval_only) {
    TLOG_INFO("evaluated the weights of iteration {} in {:.2f} s", evaluated, seconds);
  } else {
    TLOG_INFO("trained {} iterations in {:.2f} s; final loss {:.6f}", spec.iterations, seconds, final_loss);
  }
  return absl::OkStatus();
}

}  // namespace tessera::cluster
