#include "cluster/local_train.h"

#include <chrono>
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
// "worker local (node 0): CODE: message".
absl::Status JobError(const control::JobInfo& info) {
  std::string reason = info.reason();
  const std::string prefix = absl::StrCat("worker ", kWorkerId, " (node 0): ");
  if (!reason.starts_with(prefix)) return absl::InternalError(reason);
  reason.erase(0, prefix.size());
  for (int code = 1; code <= 16; ++code) {
    const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code)) + ": ";
    if (reason.starts_with(name)) return absl::Status(static_cast<absl::StatusCode>(code), reason.substr(name.size()));
  }
  return absl::InternalError(reason);
}

}  // namespace

absl::Status TrainOnThisMachine(const nlohmann::json& config, std::FILE* progress) {
  // The master's own checks first, so a bad config starts nothing.
  ASSIGN_OR_RETURN(const JobSpec spec, MakeEngineJobCompiler()->Resolve(config.dump(), {}));
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
  worker_options.devices = absl::StrCat("cpu:", spec.devices_needed);
  worker_options.worker_id = kWorkerId;
  worker_options.security = security;
  Worker worker(worker_options, MakeEnginePlanRunnerFactory());
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
  RETURN_IF_ERROR(client.Watch(job, [&](const control::JobEvent& event) {
    if (!event.has_metrics()) return true;
    nlohmann::json values = nlohmann::json::object();
    for (const auto& [name, value] : event.metrics().values()) values[name] = value;
    final_loss = values.value("loss", 0.0);
    if (progress != nullptr) {
      std::fputs(FormatProgressLine(event.metrics().iteration(), spec.iterations, values).c_str(), progress);
      std::fflush(progress);
    }
    return true;
  }));
  ASSIGN_OR_RETURN(const control::JobInfo info, client.Get(job));
  if (info.state() != control::SUCCEEDED) return JobError(info);
  TLOG_INFO("trained {} iterations in {:.2f} s; final loss {:.6f}", spec.iterations,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), final_loss);
  return absl::OkStatus();
}

}  // namespace tessera::cluster
