// embed_client: a C++ program that submits a job to a Tessera master with
// tessera::cluster::Client and follows it to its end.
//
//   embed_client --master 127.0.0.1:7070 configs/gpt2_nano.json train.train_iter=20
//
// Prints one line per event of the job (state changes and the metrics the
// worker reports) and exits 0 when the job SUCCEEDED. Any other ending (the
// job FAILED or was CANCELLED, the master refused the config, no master
// answers) is one line on stderr and exit 1.

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cluster/client.h"
#include "core/config.h"

namespace {

using tessera::control::JobEvent;
using tessera::control::JobInfo;
using tessera::control::JobState_Name;

// One line on stderr, whatever the message holds; the exit code of a failure.
int Fail(std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "embed_client: %s\n", message.c_str());
  return 1;
}

// A metric the worker reported; NaN (printed "nan") when it did not report it.
double Value(const tessera::control::Metrics& metrics, const std::string& name) {
  auto it = metrics.values().find(name);
  return it == metrics.values().end() ? std::nan("") : it->second;
}

void PrintEvent(const JobEvent& event) {
  if (event.has_metrics()) {
    // The worker holding the loss reports these every train.log_period
    // iterations (cluster/engine_job.cc): loss, lr, grad_norm, samples_per_s.
    const tessera::control::Metrics& m = event.metrics();
    std::printf("iter %lld  loss %.6f  lr %.3g  samples/s %.1f\n", static_cast<long long>(m.iteration()),
                Value(m, "loss"), Value(m, "lr"), Value(m, "samples_per_s"));
  } else if (event.has_state()) {
    const JobInfo& job = event.state();
    std::printf("%s %s%s%s\n", job.job_id().c_str(), JobState_Name(job.state()).c_str(),
                job.reason().empty() ? "" : ": ", job.reason().c_str());
  }
  // Log lines (event.log_line()) are what `tessera logs` shows; left out here.
  std::fflush(stdout);
}

int Run(const std::string& master, const std::string& token_file, const std::string& config_path,
        const std::vector<std::string>& overrides) {
  tessera::cluster::Client::Options options;
  options.master = master;
  if (!token_file.empty()) {
    auto token = tessera::cluster::ReadSecretFile(token_file, tessera::cluster::SecretKind::kToken);
    if (!token.ok()) return Fail(std::string(token.status().message()));
    options.security.token = *token;
  }

  // The config's _base_ files are resolved here, where they are; the master
  // applies the overrides and checks the result against the job schema.
  auto config = tessera::config::LoadConfigFiles(config_path);
  if (!config.ok()) return Fail(std::string(config.status().message()));

  tessera::cluster::Client client(options);
  auto job_id = client.Submit(config->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), overrides);
  if (!job_id.ok()) {
    if (job_id.status().code() == absl::StatusCode::kUnavailable) {
      return Fail(absl::StrCat("no master answers at ", master, ": ", job_id.status().message()));
    }
    // The client's own checks of its options (an address it cannot use)
    // say "client: ...": nothing reached a master.
    if (std::string message(job_id.status().message()); message.starts_with("client: ")) return Fail(message);
    return Fail(absl::StrCat("the master at ", master, " refused the job: ", job_id.status().message()));
  }
  std::printf("submitted %s\n", job_id->c_str());
  std::fflush(stdout);

  // Watch replays the job's events from its first and returns when it ends.
  JobInfo last;
  const absl::Status watched = client.Watch(*job_id, [&](const JobEvent& event) {
    if (event.has_state()) last = event.state();
    PrintEvent(event);
    return true;  // keep following
  });
  if (!watched.ok()) return Fail(absl::StrCat("lost job ", *job_id, ": ", watched.message()));
  if (last.state() != tessera::control::SUCCEEDED) {
    return Fail(absl::StrCat("job ", *job_id, " ", JobState_Name(last.state()), last.reason().empty() ? "" : ": ",
                             last.reason()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Submit a job to a Tessera master and print its metrics until it ends."};
  std::string master;
  std::string token_file;
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("--master", master, "The master's address, HOST:PORT")->required();
  app.add_option("--token-file", token_file, "File holding the master's shared token");
  app.add_option("CONFIG", config_path, "Job config file (JSON, comments allowed)")->required();
  app.add_option("overrides", overrides, "key.path=value overrides, applied by the master");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(absl::StrCat(e.what(), " (see --help)"));
  }
  return Run(master, token_file, config_path, overrides);
}
