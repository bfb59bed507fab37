#pragma once
// Test doubles for the cluster daemons; never shipped.
//
// FakeJobCompiler reads a tiny config of its own (JSON object):
//   devices_needed (default 1), iterations (default 5), output_dir,
//   step_ms (default 2), fail_node + fail_at (node fail_node fails at that
//   iteration), hang (every node waits until cancelled), rendezvous (nodes
//   meet through the KV before training), load_ms (each node's Load takes
//   that long), interrupt_at (every node stops at that iteration as a
//   signalled process does: "interrupted at iteration N"), log_every (node
//   0 reports metrics every that many iterations; default 1).
// Overrides are "key=value" on those top-level keys (value as JSON, else a
// string). A "compile_error" key makes Compile fail with its text.
//
// SleepyTestRunner "trains" by sleeping step_ms per iteration and reporting
// a fake loss; Cancel ends Run at once with the reason. RunnerCounters count
// live runners and runs, so tests can see a runner stopped.

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cluster/job_interfaces.h"

namespace tessera::cluster::testing {

class FakeJobCompiler final : public JobCompiler {
 public:
  absl::StatusOr<JobSpec> Resolve(const std::string& config_json, const std::vector<std::string>& overrides) override;
  absl::StatusOr<std::vector<std::string>> Compile(const JobSpec& spec, const std::vector<WorkerSlot>& slots) override;
};

struct RunnerCounters {
  std::atomic<int> live{0};       // runners constructed and not destroyed
  std::atomic<int> running{0};    // inside Run
  std::atomic<int> cancelled{0};  // Run returned because of Cancel
};

class SleepyTestRunner final : public PlanRunner {
 public:
  explicit SleepyTestRunner(std::shared_ptr<RunnerCounters> counters);
  ~SleepyTestRunner() override;
  absl::Status Load(const RunContext& context, std::string_view node_plan) override;
  absl::Status Run() override;
  void Cancel(const absl::Status& reason) override;

 private:
  std::shared_ptr<RunnerCounters> counters_;
  RunContext context_;
  int64_t iterations_ = 0;
  int64_t step_ms_ = 0;
  int64_t fail_at_ = -1;
  int64_t interrupt_at_ = -1;
  int64_t log_every_ = 1;
  bool evaluate_at_end_ = false;
  bool hang_ = false;
  bool rendezvous_ = false;
  std::mutex mu_;
  std::condition_variable cancelled_cv_;
  absl::Status cancel_reason_;  // guarded by mu_; not OK once cancelled
};

PlanRunnerFactory SleepyRunnerFactory(std::shared_ptr<RunnerCounters> counters);

}  // namespace tessera::cluster::testing
