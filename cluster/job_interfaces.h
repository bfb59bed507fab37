#pragma once
// The two seams between the cluster daemons and the engine: the master asks a
// JobCompiler to resolve and compile a job; the worker asks a PlanRunner to
// run its node's part. cluster/ knows nothing of configs or plans beyond
// these interfaces, so the real compiler (train/, scheduler/) and runner
// (actors/) plug in without changes here.
//
// Thread-safety: the master calls one JobCompiler from one thread at a time
// (it serialises the calls). A PlanRunner is used by one job: Load, then Run
// on the job's thread; Cancel and RequestStop may come from any thread, at
// any time (before Run, during it, after it), any number of times.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/collective/kv_store.h"
#include "nlohmann/json.hpp"

namespace tessera::cluster {

// One worker's share of a job: the job's node `node` runs on `worker_id`
// with `num_devices` of its devices.
struct WorkerSlot {
  std::string worker_id;
  uint32_t node = 0;
  int num_devices = 0;
  std::string data_address;
};

// A resolved job: what the master needs to queue it and write its outputs.
struct JobSpec {
  nlohmann::json config;  // the resolved config (written to output_dir/config.json)
  int64_t devices_needed = 0;
  // The type of device it runs on ("cpu", "cuda"): it is placed only on
  // workers offering that type (`tessera worker --devices TYPE:...`).
  std::string device_type = "cpu";
  int64_t iterations = 0;
  // The iteration the job continues from (a resumed job); its outputs
  // continue the earlier run's: metrics.jsonl keeps the rows up to it and
  // both files are appended to.
  int64_t start_iteration = 0;
  std::string output_dir;  // empty: the master writes no outputs
  // Lines for the job's log, not errors (a resume with other seeds).
  std::vector<std::string> warnings;
};

// Master side: resolves and compiles jobs. Errors are one line (the config
// error for a bad config).
class JobCompiler {
 public:
  virtual ~JobCompiler() = default;
  [[nodiscard]] virtual absl::StatusOr<JobSpec> Resolve(const std::string& config_json,
                                                        const std::vector<std::string>& overrides) = 0;
  // One serialised node plan per slot, in slot order; slot i is node i of the job.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> Compile(const JobSpec& spec,
                                                                         const std::vector<WorkerSlot>& slots) = 0;
  // The latest complete checkpoint in spec.output_dir (nullopt: none), for
  // the master to say where `--resume` would continue; an error where the
  // compiler cannot tell. A read of the disk: thread-safe (the master calls
  // it without holding the compiler while another job compiles).
  struct CheckpointMark {
    int64_t iteration = 0;
    // A stop cut short the evaluation due at it (`--resume` runs it).
    bool evaluation_pending = false;
  };
  [[nodiscard]] virtual absl::StatusOr<std::optional<CheckpointMark>> LatestCheckpoint(const JobSpec& spec) {
    (void)spec;
    return absl::UnimplementedError("this job compiler does not read checkpoints");
  }
};

// One report of a node's progress. Values are free-form (loss, lr,
// grad_norm, samples_per_s, tokens_per_s); the master writes every report to
// metrics.jsonl as {"iter": iteration, <values>...}, the trainer's format, so
// one node reports for the job (the engine: the node holding the sink).
struct JobMetrics {
  int64_t iteration = 0;
  std::map<std::string, double> values;
};

// Worker side: what a runner gets for one node plan of one job. Everything
// borrowed here outlives the runner.
struct RunContext {
  std::string job_id;
  uint64_t session = 0;  // a number unique per job on this master
  uint32_t node = 0;
  std::vector<WorkerSlot> slots;  // every node of the job
  // The master's KV (rendezvous), see comm/collective/kv_store.h. Keys are
  // namespaced by job and session, so runs never see each other's keys.
  comm::KvStore* kv = nullptr;
  // The cluster's token (empty: none): the nodes' actor-bus links
  // authenticate with it.
  std::string token;
  // Forwarded to the master (blocking, a loopback RPC each; never throw).
  std::function<void(const JobMetrics&)> report_metrics;
  std::function<void(const std::string&)> report_log;
  // The iterations this node has completed, after each one (cheap: no RPC;
  // the worker's heartbeats carry the latest to the master, so a job's
  // progress shows between its logged iterations). May be unset.
  std::function<void(int64_t)> report_progress;
};

// Worker side: runs one node plan of one job.
class PlanRunner {
 public:
  virtual ~PlanRunner() = default;
  [[nodiscard]] virtual absl::Status Load(const RunContext& context, std::string_view node_plan) = 0;
  [[nodiscard]] virtual absl::Status Run() = 0;  // blocks until the node's part ends
  virtual void Cancel(const absl::Status& reason) = 0;  // any thread; Run returns promptly with an error
  // A graceful stop (any thread, any time): the run ends at an iteration
  // boundary that the job's nodes agree on, keeping what it trained (the
  // engine's runner writes a checkpoint there), and Run returns Cancelled
  // saying where, or OK when the run reached its end anyway. A runner
  // without one cancels.
  virtual void RequestStop(const absl::Status& reason) { Cancel(reason); }
};

using PlanRunnerFactory = std::function<std::unique_ptr<PlanRunner>()>;

}  // namespace tessera::cluster
