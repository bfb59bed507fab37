#include "apps/cluster_commands.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "apps/cli_errors.h"
#include "cluster/client.h"
#include "cluster/device_offer.h"
#include "cluster/master.h"
#include "cluster/tls_material.h"
#include "cluster/transport.h"
#include "cluster/worker.h"
#include "core/config.h"
#include "core/file_util.h"
#include "core/storage.h"
#include "core/strings.h"

namespace tessera {
namespace {

using cluster::Client;
using cluster::Security;


// The flags every verb shares: where the master is and how to reach it.
struct SecurityFlags {
  std::string token_file;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  std::string tls_server_name;

  // `peer_cert`: what --tls-ca verifies ("the master's certificate"; on the
  // master, which dials the workers, "the workers' certificates").
  void AddClientFlags(CLI::App* verb, const std::string& peer_cert = "the master's certificate") {
    verb->add_option("--token-file", token_file, "File holding the shared token (authorization: Bearer)");
    verb->add_option(
        "--tls-ca", tls_ca,
        "PEM roots to verify " + peer_cert +
            (serves ? " (TLS is all or nothing on a daemon: with --tls-cert and --tls-key)" : " (turns TLS on)"));
    verb->add_option("--tls-server-name", tls_server_name,
                     "The name in " + peer_cert + ", if not the host dialled");
  }
  bool serves = false;  // a daemon's: it serves and dials (AddServerFlags)

  void AddServerFlags(CLI::App* verb, const std::string& peer_cert = "the master's certificate") {
    serves = true;
    AddClientFlags(verb, peer_cert);
    verb->add_option("--tls-cert", tls_cert,
                     "PEM certificate this daemon serves with (TLS needs all three: --tls-cert, --tls-key, --tls-ca)");
    verb->add_option("--tls-key", tls_key, "PEM private key of --tls-cert");
  }

  Security Load() const {
    Security security;
    auto read = [](const char* flag, const std::string& path, cluster::SecretKind kind, std::string& out) {
      if (path.empty()) return;
      auto contents = cluster::ReadSecretFile(path, kind);
      if (!contents.ok()) Fail(absl::StrCat(flag, ": ", contents.status().message()));
      out = *contents;
    };
    read("--token-file", token_file, cluster::SecretKind::kToken, security.token);
    read("--tls-cert", tls_cert, cluster::SecretKind::kCertificates, security.tls_cert);
    read("--tls-key", tls_key, cluster::SecretKind::kPrivateKey, security.tls_key);
    read("--tls-ca", tls_ca, cluster::SecretKind::kCaCertificates, security.tls_ca);
    if (security.tls_cert.empty() != security.tls_key.empty()) Fail("--tls-cert and --tls-key go together");
    if (!security.tls_cert.empty()) {
      if (absl::Status pair = cluster::CheckServedPair(security.tls_cert, security.tls_key); !pair.ok()) {
        Fail(absl::StrCat("--tls-cert '", tls_cert, "' and --tls-key '", tls_key, "': ", pair.message()));
      }
    }
    // A daemon with --tls-ca alone served plaintext and dialled TLS (its
    // peers failed to call it); with a certificate and no CA it dialled
    // plaintext peers that serve TLS.
    if (serves && security.tls_cert.empty() != security.tls_ca.empty()) {
      Fail(
          absl::StrCat("TLS is all or nothing on a daemon (it serves and dials): give --tls-cert, --tls-key and "
                       "--tls-ca together (",
                       security.tls_ca.empty() ? "--tls-ca is missing" : "--tls-ca alone would serve plaintext", ")"));
    }
    // The name is checked against a verified certificate: without TLS
    // nothing reads it.
    if (!tls_server_name.empty() && security.tls_ca.empty()) {
      Fail("--tls-server-name names the peer's certificate, which only TLS checks: give --tls-ca too");
    }
    security.tls_server_name = tls_server_name;
    return security;
  }
};

// Blocks SIGINT/SIGTERM in this thread (and so in every thread it starts)
// for its lifetime; Wait returns when one arrives. `hangup`: SIGHUP too (a
// daemon's terminal closed: a graceful stop, not the default's instant
// death), unless the process was started ignoring it (`nohup`), which it
// goes on doing.
class StopSignals {
 public:
  explicit StopSignals(bool hangup = false) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    if (hangup && !tessera::SignalIgnored(SIGHUP)) sigaddset(&set_, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  }
  ~StopSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  int Wait() {
    int signal = 0;
    sigwait(&set_, &signal);
    return signal;
  }
  // Stops blocking them: the next one has its default action (ends the
  // process).
  void Release() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  // The signal that arrived within `timeout_ms`; 0: none.
  int WaitFor(int timeout_ms) {
    const timespec timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
    const int signal = sigtimedwait(&set_, nullptr, &timeout);
    return signal < 0 ? 0 : signal;
  }

 private:
  sigset_t set_;
  sigset_t previous_;
};

// A daemon's stop: the first signal runs `drain` (its graceful stop: jobs
// end at an iteration boundary with a checkpoint), then `shutdown`; a
// second runs `shutdown` at once (the jobs stop without a checkpoint, and
// `drain` returns); a third, no longer blocked, ends the process. One
// within kRepeatedSignalWindowMs of the first is the same one delivered
// twice.
void StopOnSignals(StopSignals& signals, const char* daemon, const std::function<bool()>& busy,
                   const std::function<void()>& drain, const std::function<void()>& shutdown) {
  const int signal = signals.Wait();
  const auto first = std::chrono::steady_clock::now();
  if (busy()) {
    std::fprintf(stderr,
                 "tessera %s: %s: stopping its jobs at an iteration boundary and writing a checkpoint "
                 "(again to stop at once)\n",
                 daemon, tessera::StopSignalVerb(signal));
  }
  std::atomic<bool> drained = false;
  std::thread drainer([&] {
    drain();
    drained = true;
  });
  while (!drained.load()) {
    if (signals.WaitFor(100) != 0) {
      // The same signal delivered twice (GNU timeout signals the child,
      // then its process group) counts once, as for `tessera train`.
      if (std::chrono::steady_clock::now() - first < std::chrono::milliseconds(kRepeatedSignalWindowMs)) continue;
      const std::string latest = tessera::LastCommittedCheckpoint();
      std::fprintf(stderr, "tessera %s: stopping its jobs at once, without a checkpoint%s (again to kill it)\n", daemon,
                   latest.empty() ? "" : absl::StrCat(" (the latest written here: ", latest, ")").c_str());
      break;
    }
  }
  // From here on a signal ends the process, whatever the shutdown waits on.
  signals.Release();
  shutdown();
  drainer.join();
}

void PrintJob(const control::JobInfo& job) {
  std::string progress = absl::StrCat(job.iteration(), "/", job.iterations());
  // (Reasons come from clients and workers: escaped, as log lines are.)
  std::printf("%-12s %-10s %9s  %s\n", job.job_id().c_str(), control::JobState_Name(job.state()).c_str(),
              progress.c_str(), OneLine(job.reason()).c_str());
}

// Prints one event as a line.
void PrintEvent(const control::JobEvent& event) {
  if (event.has_state()) {
    const control::JobInfo& info = event.state();
    std::printf("[%s] %s%s%s\n", info.job_id().c_str(), control::JobState_Name(info.state()).c_str(),
                info.reason().empty() ? "" : ": ", OneLine(info.reason()).c_str());
  } else if (event.has_metrics()) {
    // By name: a protobuf map has no order of its own.
    const std::map<std::string, double> sorted(event.metrics().values().begin(), event.metrics().values().end());
    std::string values;
    for (const auto& [name, value] : sorted) absl::StrAppend(&values, "  ", name, " ", value);
    std::printf("iter %lld%s\n", static_cast<long long>(event.metrics().iteration()), values.c_str());
  } else if (event.has_log_line()) {
    // (A terminal's control sequences, a NUL, bytes not UTF-8: escaped.)
    std::printf("%s\n", OneLine(event.log_line()).c_str());
  }
  std::fflush(stdout);
}

// A Watch of `job_id` on the master at `master` that ended in `status`:
// one line, saying the master was lost when the connection was (after
// `followed` events; before any, the master was never reached: said as
// `tessera status` says it).
[[noreturn]] void FailWatch(const absl::Status& status, const std::string& master, const std::string& job_id,
                            bool followed) {
  if (status.code() == absl::StatusCode::kUnavailable && followed) {
    Fail(absl::StrCat("lost the master at ", master, " while following job ", job_id, " (", status.message(),
                      "): `tessera status ", job_id, "` tells how it ends"));
  }
  Fail(std::string(status.message()));
}

// Whether a job in `state` has ended.
bool IsFinalState(control::JobState state) {
  return state == control::SUCCEEDED || state == control::FAILED || state == control::CANCELLED;
}

// Fails (exit 1) unless `job` ended as `wanted`, naming how it ended (its
// reason too, unless the follower printed it as the job's last line).
void ExpectEnd(const control::JobInfo& job, control::JobState wanted, bool reason_printed = false) {
  if (job.state() == wanted) return;
  if (reason_printed || job.reason().empty()) {
    Fail(absl::StrCat("job ", job.job_id(), " ", control::JobState_Name(job.state()),
                      reason_printed && !job.reason().empty() ? " (the line above says why)" : ""));
  }
  Fail(absl::StrCat("job ", job.job_id(), " ", control::JobState_Name(job.state()), ": ", job.reason()));
}

// Follows the job to its end; fails unless it SUCCEEDED.
// Ctrl-C while following a job (submit --follow, logs -f) stops the
// following, saying the job runs on (it ended the process silently with
// 130). Made before the client, so that gRPC's threads block the signals
// too.
class FollowInterrupt {
 public:
  FollowInterrupt() = default;
  ~FollowInterrupt() {
    done_ = true;
    if (waiter_.joinable()) waiter_.join();
  }
  void Watch(Client& client) {
    waiter_ = std::thread([this, &client] {
      while (!done_) {
        if (signals_.WaitFor(100) != 0) {
          interrupted_ = true;
          client.StopWatches();
          return;
        }
      }
    });
  }
  // Ends the verb with exit status 130 when the following was interrupted.
  void ExitIfInterrupted(const std::string& job_id) {
    if (!interrupted_) return;
    throw CLI::RuntimeError(
        absl::StrCat("stopped following job ", job_id, "; it runs on (`tessera cancel ", job_id, "` stops it)"), 130);
  }

 private:
  StopSignals signals_;
  std::atomic<bool> done_ = false;
  std::atomic<bool> interrupted_ = false;
  std::thread waiter_;
};

void Follow(Client& client, const std::string& master, const std::string& job_id, bool print_everything,
            FollowInterrupt* interrupt = nullptr) {
  control::JobInfo last;
  if (interrupt != nullptr) interrupt->Watch(client);
  const absl::Status watched = client.Watch(job_id, [&](const control::JobEvent& event) {
    if (event.has_state()) last = event.state();
    if (print_everything || event.has_log_line()) PrintEvent(event);
    return true;
  });
  if (interrupt != nullptr) interrupt->ExitIfInterrupted(job_id);
  // (A job just submitted: its master was reached.)
  if (!watched.ok()) FailWatch(watched, master, job_id, /*followed=*/true);
  last.set_job_id(job_id);
  ExpectEnd(last, control::SUCCEEDED,
            /*reason_printed=*/print_everything && last.state() != control::JOB_STATE_UNSPECIFIED);
}

// CLI11's check of an address flag (cluster::CheckAddress).
CLI::Validator AddressCheck(bool port_required = true) {
  return CLI::Validator(
      [port_required](std::string& value) {
        const absl::Status status = cluster::CheckAddress(value, port_required);
        return status.ok() ? std::string() : std::string(status.message());
      },
      port_required ? "HOST:PORT" : "HOST[:PORT]");
}

// --metrics-host: the metrics server binds a numeric address (nothing is
// looked up); the master said "metrics: bad address 'localhost': Invalid
// argument".
CLI::Validator NumericAddressCheck() {
  return CLI::Validator(
      [](const std::string& value) {
        in6_addr parsed{};
        if (::inet_pton(AF_INET, value.c_str(), &parsed) == 1 || ::inet_pton(AF_INET6, value.c_str(), &parsed) == 1) {
          return std::string();
        }
        return absl::StrCat("'", value, "' is not a numeric IP address (127.0.0.1, 0.0.0.0, ::1, ...)");
      },
      "IP");
}

struct ClientFlags {
  std::string master = "127.0.0.1:7070";
  SecurityFlags security;
  void Add(CLI::App* verb) {
    verb->add_option("--master", master, "The master's address")->capture_default_str()->check(AddressCheck());
    security.AddClientFlags(verb);
  }
  std::unique_ptr<Client> Connect() const {
    Client::Options options;
    options.master = master;
    options.security = security.Load();
    return std::make_unique<Client>(options);
  }
};

}  // namespace

void AddClusterCommands(CLI::App& app, ClusterCommandDeps deps) {
  auto shared_deps = std::make_shared<ClusterCommandDeps>(std::move(deps));

  // ---- master ----
  struct MasterFlags {
    std::string listen = "127.0.0.1:7070";
    std::string state_dir;
    int metrics_port = -1;
    std::string metrics_host = "127.0.0.1";
    int heartbeat_ms = 1000;
    int worker_timeout_ms = 5000;
    SecurityFlags security;
  };
  auto master_flags = std::make_shared<MasterFlags>();
  CLI::App* master = app.add_subcommand(
      "master",
      "Run the master: queues, compiles and watches jobs (until SIGINT/SIGTERM/SIGHUP: running jobs stop "
      "with a checkpoint, queued ones wait for the next master on --state-dir; again to stop at once)");
  master->add_option("--listen", master_flags->listen, "Address to serve on (port 0: the OS picks)")
      ->capture_default_str()
      ->check(AddressCheck());
  master->add_option(
      "--state-dir", master_flags->state_dir,
      "Directory of job records (the job history and queue survive restarts; without one, a shutdown cancels "
      "the queued jobs)");
  master
      ->add_option("--metrics-port", master_flags->metrics_port,
                   "Serve Prometheus /metrics on PORT (of --metrics-host)")
      ->check(InRange(0, 65535));
  master
      ->add_option("--metrics-host", master_flags->metrics_host,
                   "Address /metrics binds (a routable one lets Prometheus scrape it)")
      ->capture_default_str()
      ->check(NumericAddressCheck())
      ->needs("--metrics-port");
  master->add_option("--heartbeat-ms", master_flags->heartbeat_ms, "Heartbeat interval of workers")
      ->check(InRange(10, 600000))
      ->capture_default_str();
  master->add_option("--worker-timeout-ms", master_flags->worker_timeout_ms, "A worker silent this long is lost")
      ->check(InRange(10, 3600000))
      ->capture_default_str();
  master_flags->security.AddServerFlags(master, "the workers' certificates");
  master->callback([master_flags, shared_deps] {
    if (!shared_deps->make_compiler) Fail("master: this build has no job compiler");
    // A worker gets at least two heartbeats to show it lives, or every
    // worker is lost and registers again, over and over.
    if (master_flags->worker_timeout_ms < 2 * master_flags->heartbeat_ms) {
      Fail(absl::StrCat("--worker-timeout-ms ", master_flags->worker_timeout_ms,
                        " must be at least twice --heartbeat-ms ", master_flags->heartbeat_ms));
    }
    cluster::Master::Options options;
    options.listen = master_flags->listen;
    options.state_dir = master_flags->state_dir;
    options.metrics_port = master_flags->metrics_port;
    options.metrics_host = master_flags->metrics_host;
    options.heartbeat_interval = absl::Milliseconds(master_flags->heartbeat_ms);
    options.worker_timeout = absl::Milliseconds(master_flags->worker_timeout_ms);
    options.security = master_flags->security.Load();
    StopSignals signals(/*hangup=*/true);
    cluster::Master daemon(options, shared_deps->make_compiler());
    auto address = daemon.Start();
    if (!address.ok()) Fail(std::string(address.status().message()));
    std::printf("master listening on %s\n", address->c_str());
    if (daemon.metrics_port() >= 0) {
      // (An IPv6 host is bracketed in a URL.)
      const bool ipv6 = options.metrics_host.find(':') != std::string::npos;
      std::printf("metrics on http://%s%s%s:%d/metrics\n", ipv6 ? "[" : "", options.metrics_host.c_str(),
                  ipv6 ? "]" : "", daemon.metrics_port());
    }
    std::fflush(stdout);
    // A graceful shutdown: running jobs stop at an iteration boundary with
    // a checkpoint, queued ones stay queued for the next master
    // (Master::Drain).
    StopOnSignals(
        signals, "master", [&] { return daemon.jobs_running() > 0; }, [&] { daemon.Drain(); },
        [&] { daemon.Shutdown(); });
    Succeed();
  });

  // ---- worker ----
  struct WorkerFlags {
    std::string master = "127.0.0.1:7070";
    std::string listen = "127.0.0.1:0";
    std::string devices;
    std::string data_address;
    std::string id;
    SecurityFlags security;
  };
  auto worker_flags = std::make_shared<WorkerFlags>();
  CLI::App* worker = app.add_subcommand(
      "worker",
      "Run a worker: runs the master's node plans on its devices (until SIGINT/SIGTERM/SIGHUP: its jobs stop with "
      "a checkpoint; again to stop at once)");
  worker->add_option("--master", worker_flags->master, "The master's address")
      ->capture_default_str()
      ->check(AddressCheck());
  worker
      ->add_option("--devices", worker_flags->devices,
                   "Devices to offer: cpu:N (N virtual CPU devices), or GPUs by index: cuda:I, cuda:A-B, cuda:0,2-3")
      ->required();
  worker->add_option("--listen", worker_flags->listen, "Address of its Worker service")
      ->capture_default_str()
      ->check(AddressCheck());
  worker
      ->add_option("--data-address", worker_flags->data_address,
                   "Its data-plane host, given to peers (gloo listens there on ports it picks; default 127.0.0.1)")
      ->check(CLI::Validator(
          [](std::string& value) {
            const absl::Status status = cluster::CheckDataHost(value);
            return status.ok() ? std::string() : std::string(status.message());
          },
          "HOST"));
  worker->add_option("--id", worker_flags->id, "Its worker id (default: the master assigns one)")
      ->check(CLI::Validator(
          [](std::string& value) {
            return cluster::IsPlainId(value) ? std::string()
                                             : absl::StrCat("'", value, "' is not 1-128 characters of [A-Za-z0-9._-]");
          },
          "ID"));
  worker_flags->security.AddServerFlags(worker);
  worker->callback([worker_flags, shared_deps] {
    if (!shared_deps->make_runner) Fail("worker: this build has no plan runner");
    const absl::StatusOr<cluster::DeviceOffer> offer = cluster::ParseDeviceOffer(worker_flags->devices);
    if (!offer.ok()) Fail(std::string(offer.status().message()));
    // The GPUs offered are the plans' cuda:0 .. count-1: narrowed before CUDA starts.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    const auto cuda_visible = cluster::CudaVisibleDevices(
        *offer, visible == nullptr ? std::nullopt : std::optional<std::string_view>(visible));
    if (!cuda_visible.ok()) {
      Fail(absl::StrCat("--devices '", worker_flags->devices, "': ", cuda_visible.status().message()));
    }
    if (cuda_visible->has_value()) ::setenv("CUDA_VISIBLE_DEVICES", (*cuda_visible)->c_str(), 1);
    // GPUs it offers must be there: a worker never offers what its jobs
    // would only find missing when they load.
    if (offer->type == DeviceType::kCuda) {
      const std::string narrowed = absl::StrCat("(CUDA_VISIBLE_DEVICES=", cuda_visible->value_or(""), ")");
      const absl::StatusOr<int> gpus = CudaDeviceCount();
      if (!gpus.ok()) {
        Fail(absl::StrCat("--devices '", worker_flags->devices, "': ", gpus.status().message(), " ", narrowed));
      }
      if (*gpus < offer->count()) {
        Fail(absl::StrCat("--devices '", worker_flags->devices, "' offers ", offer->count(),
                          " GPU(s), this machine shows ", *gpus, " of them ", narrowed));
      }
    }
    cluster::Worker::Options options;
    options.master = worker_flags->master;
    options.listen = worker_flags->listen;
    options.devices = worker_flags->devices;
    options.data_address = worker_flags->data_address;
    options.worker_id = worker_flags->id;
    options.security = worker_flags->security.Load();
    StopSignals signals(/*hangup=*/true);
    cluster::Worker daemon(options, shared_deps->make_runner);
    auto address = daemon.Start();
    if (!address.ok()) Fail(std::string(address.status().message()));
    std::printf("worker serving on %s, registering with %s\n", address->c_str(), options.master.c_str());
    std::fflush(stdout);
    // A graceful shutdown: the jobs it holds stop at an iteration boundary
    // with a checkpoint (Worker::Drain).
    StopOnSignals(
        signals, "worker", [&] { return daemon.jobs_held() > 0; }, [&] { daemon.Drain(); }, [&] { daemon.Shutdown(); });
    Succeed();
  });

  // ---- submit ----
  struct SubmitFlags {
    ClientFlags client;
    std::string config;
    std::vector<std::string> overrides;
    bool follow = false;
    bool resume = false;
    bool eval_only = false;
    bool fast_dev_run = false;
  };
  auto submit_flags = std::make_shared<SubmitFlags>();
  CLI::App* submit = app.add_subcommand("submit", "Submit a job to the master; prints its id");
  submit_flags->client.Add(submit);
  submit->add_option("CONFIG", submit_flags->config, "Config file (JSON, comments allowed, _base_ resolved here)")
      ->required();
  submit->add_option("overrides", submit_flags->overrides, "key.path=value overrides (applied by the master)");
  submit->add_flag("--follow", submit_flags->follow, "Print the job's progress until it ends; exit 1 unless it succeeds");
  submit->add_flag("--resume", submit_flags->resume,
                   "Continue from the latest checkpoint in train.output_dir/checkpoints (sets train.resume=true)");
  submit->add_flag("--eval-only", submit_flags->eval_only,
                   "Train nothing: evaluate train.load_weight's weights, or else the latest checkpoint's in "
                   "train.output_dir/checkpoints (sets train.eval_only=true)");
  submit->add_flag("--fast-dev-run", submit_flags->fast_dev_run,
                   "Check a config end to end: 20 iterations from scratch with evaluations (2 batches) and "
                   "checkpoints at 10 and 20, into train.output_dir/fast_dev_run");
  submit->callback([submit_flags, shared_deps] {
    if (auto error = AddFlagOverrides(submit_flags->overrides, submit_flags->resume, submit_flags->eval_only)) {
      Fail(*error);
    }
    if (submit_flags->fast_dev_run) {
      // Resolved here with this machine's schema, so the master gets plain
      // overrides (output_dir stays as the config writes it: the master's).
      if (!shared_deps->fast_dev_run_overrides) Fail("--fast-dev-run: this build's submit cannot resolve job configs");
      auto all = shared_deps->fast_dev_run_overrides(submit_flags->config, submit_flags->overrides);
      if (!all.ok()) Fail(std::string(all.status().message()));
      submit_flags->overrides = *std::move(all);
    }
    auto config = config::LoadConfigFiles(submit_flags->config);
    if (!config.ok()) Fail(std::string(config.status().message()));
    std::optional<FollowInterrupt> interrupt;
    if (submit_flags->follow) interrupt.emplace();
    auto client = submit_flags->client.Connect();
    auto job = client->Submit(config->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                              submit_flags->overrides);
    if (!job.ok()) Fail(std::string(job.status().message()));
    std::printf("%s\n", job->c_str());
    std::fflush(stdout);
    if (submit_flags->follow) {
      Follow(*client, submit_flags->client.master, *job, /*print_everything=*/true, &*interrupt);
    }
    Succeed();
  });

  // ---- status ----
  struct JobFlags {
    ClientFlags client;
    std::string job;
    bool follow = false;
    bool now = false;
  };
  auto status_flags = std::make_shared<JobFlags>();
  CLI::App* status = app.add_subcommand("status", "List the master's jobs and workers, or show one job");
  status_flags->client.Add(status);
  status->add_option("JOB", status_flags->job, "A job id");
  status->callback([status_flags, status] {
    auto client = status_flags->client.Connect();
    // (An empty one, `status "$JOB"` with JOB unset, listed every job.)
    if (status->count("JOB") > 0) {
      auto job = client->Get(status_flags->job);
      if (!job.ok()) Fail(std::string(job.status().message()));
      PrintJob(*job);
      std::vector<std::string> workers;
      for (const auto& slot : job->slots()) workers.push_back(absl::StrCat(slot.worker_id(), ":", slot.num_devices()));
      // (A job not placed yet said "devices 1 on []".)
      std::printf("devices %lld %s\n", static_cast<long long>(job->devices_needed()),
                  workers.empty() ? "(not placed)" : absl::StrCat("on [", absl::StrJoin(workers, ", "), "]").c_str());
      // In name order (a protobuf map's order is its own, another per call).
      const std::map<std::string, double> metrics(job->last_metrics().begin(), job->last_metrics().end());
      for (const auto& [name, value] : metrics) std::printf("%s %g\n", name.c_str(), value);
      Succeed();
    }
    auto jobs = client->List();
    if (!jobs.ok()) Fail(std::string(jobs.status().message()));
    auto workers = client->ListWorkers();
    if (!workers.ok()) Fail(std::string(workers.status().message()));
    // An empty cluster says so (nothing at all read as a hung or wrong command).
    if (jobs->empty()) std::printf("no jobs\n");
    for (const auto& job : *jobs) PrintJob(job);
    if (workers->empty()) std::printf("no workers registered\n");
    for (const auto& w : *workers) {
      std::printf("worker %s %s at %s %s%s\n", w.worker_id().c_str(), w.devices().c_str(), w.address().c_str(),
                  w.job_id().empty() ? "(free)" : w.job_id().c_str(), w.draining() ? " (shutting down)" : "");
    }
    Succeed();
  });

  // ---- logs ----
  auto logs_flags = std::make_shared<JobFlags>();
  CLI::App* logs = app.add_subcommand(
      "logs",
      "Print a job's log lines (its nodes' and the master's; of an ended job, those of its last 256 KiB of events) "
      "and, once it ended, how (-f: until it ends)");
  logs_flags->client.Add(logs);
  logs->add_option("JOB", logs_flags->job, "A job id")->required();
  logs->add_flag("-f,--follow", logs_flags->follow, "Keep printing until the job ends; exit 1 unless it succeeds");
  logs->callback([logs_flags] {
    std::optional<FollowInterrupt> interrupt;
    if (logs_flags->follow) interrupt.emplace();
    auto client = logs_flags->client.Connect();
    if (interrupt) interrupt->Watch(*client);
    std::optional<control::JobInfo> ended;
    bool followed = false;
    const absl::Status watched = client->Watch(
        logs_flags->job,
        [&ended, &followed](const control::JobEvent& event) {
          followed = true;
          // The log lines, and how the job ended (the master's last word).
          const bool end = event.has_state() && IsFinalState(event.state().state());
          if (end) ended = event.state();
          if (event.has_log_line() || end) PrintEvent(event);
          return true;
        },
        logs_flags->follow);
    if (interrupt) interrupt->ExitIfInterrupted(logs_flags->job);
    if (!watched.ok()) FailWatch(watched, logs_flags->client.master, logs_flags->job, followed);
    if (logs_flags->follow && ended) {
      ended->set_job_id(logs_flags->job);
      ExpectEnd(*ended, control::SUCCEEDED, /*reason_printed=*/true);
    }
    Succeed();
  });

  // ---- cancel ----
  auto cancel_flags = std::make_shared<JobFlags>();
  CLI::App* cancel = app.add_subcommand(
      "cancel",
      "Cancel a job: its nodes finish the iteration in flight, write a checkpoint there (`tessera submit --resume` "
      "continues from it) and the job ends CANCELLED; waits for that, then prints the job (exit 1 if it ended "
      "otherwise)");
  cancel_flags->client.Add(cancel);
  cancel->add_option("JOB", cancel_flags->job, "A job id")->required();
  cancel->add_flag("--now", cancel_flags->now, "Stop every node at once, without a checkpoint");
  cancel->callback([cancel_flags] {
    auto client = cancel_flags->client.Connect();
    auto job = client->Cancel(cancel_flags->job, "by `tessera cancel`", /*checkpoint=*/!cancel_flags->now);
    if (absl::IsFailedPrecondition(job.status())) {
      // Ended already: its line, and what was asked for if it was
      // cancelled; else its state and reason on stderr, exit 1.
      if (auto ended = client->Get(cancel_flags->job); ended.ok() && IsFinalState(ended->state())) {
        PrintJob(*ended);
        if (ended->state() == control::CANCELLED) {
          // (Said: a second cancel printed the line alone, as if it had
          // stopped the job.)
          std::fprintf(stderr, "tessera: job %s had already ended CANCELLED; nothing more to cancel\n",
                       ended->job_id().c_str());
          Succeed();
        }
        Fail(absl::StrCat("job ", ended->job_id(), " had already ended ", control::JobState_Name(ended->state()),
                          ended->reason().empty() ? "" : absl::StrCat(": ", ended->reason())));
      }
    }
    if (!job.ok()) Fail(std::string(job.status().message()));
    if (job->state() == control::RUNNING) {  // stopping: wait for its end
      const absl::Status watched = client->Watch(cancel_flags->job, [&](const control::JobEvent& event) {
        if (event.has_state()) *job = event.state();
        return true;
      });
      if (!watched.ok()) FailWatch(watched, cancel_flags->client.master, cancel_flags->job, /*followed=*/true);
    }
    PrintJob(*job);
    // It may have ended otherwise meanwhile (a node lost while stopping).
    job->set_job_id(cancel_flags->job);
    ExpectEnd(*job, control::CANCELLED);
    Succeed();
  });
}

}  // namespace tessera
