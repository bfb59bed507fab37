#include "tests/cluster/test_doubles.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace tessera::cluster::testing {

absl::StatusOr<JobSpec> FakeJobCompiler::Resolve(const std::string& config_json,
                                                 const std::vector<std::string>& overrides) {
  nlohmann::json config = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError("fake config: not a JSON object");
  }
  for (const std::string& override_text : overrides) {
    const size_t eq = override_text.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("fake config: override '", override_text, "' is not key=value"));
    }
    const std::string value = override_text.substr(eq + 1);
    nlohmann::json parsed = nlohmann::json::parse(value, nullptr, false);
    config[override_text.substr(0, eq)] = parsed.is_discarded() ? nlohmann::json(value) : parsed;
  }
  JobSpec spec;
  try {
    spec.devices_needed = config.value("devices_needed", int64_t{1});
    spec.device_type = config.value("device_type", std::string("cpu"));
    spec.iterations = config.value("iterations", int64_t{5});
    spec.output_dir = config.value("output_dir", std::string());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("fake config: ", e.what()));
  }
  if (spec.iterations < 0) return absl::InvalidArgumentError("fake config: iterations must be >= 0");
  spec.config = std::move(config);
  return spec;
}

absl::StatusOr<std::vector<std::string>> FakeJobCompiler::Compile(const JobSpec& spec,
                                                                  const std::vector<WorkerSlot>& slots) {
  if (spec.config.contains("compile_error")) {
    return absl::InvalidArgumentError(spec.config["compile_error"].dump());
  }
  std::vector<std::string> plans;
  for (const WorkerSlot& slot : slots) {
    const bool fails = spec.config.value("fail_node", int64_t{-1}) == static_cast<int64_t>(slot.node);
    nlohmann::json plan = {{"node", slot.node},
                           {"iterations", spec.iterations},
                           {"step_ms", spec.config.value("step_ms", int64_t{2})},
                           {"fail_at", fails ? spec.config.value("fail_at", int64_t{0}) : int64_t{-1}},
                           {"hang", spec.config.value("hang", false)},
                           {"rendezvous", spec.config.value("rendezvous", false)},
                           {"load_ms", spec.config.value("load_ms", int64_t{0})},
                           {"interrupt_at", spec.config.value("interrupt_at", int64_t{-1})},
                           {"log_every", spec.config.value("log_every", int64_t{1})},
                           {"evaluate_at_end", spec.config.value("evaluate_at_end", false)}};
    plans.push_back(plan.dump());
  }
  return plans;
}

SleepyTestRunner::SleepyTestRunner(std::shared_ptr<RunnerCounters> counters) : counters_(std::move(counters)) {
  ++counters_->live;
}

SleepyTestRunner::~SleepyTestRunner() { --counters_->live; }

absl::Status SleepyTestRunner::Load(const RunContext& context, std::string_view node_plan) {
  const nlohmann::json plan = nlohmann::json::parse(node_plan, nullptr, false);
  if (plan.is_discarded() || !plan.is_object()) return absl::InvalidArgumentError("test runner: plan is not JSON");
  context_ = context;
  iterations_ = plan.value("iterations", int64_t{0});
  step_ms_ = plan.value("step_ms", int64_t{2});
  fail_at_ = plan.value("fail_at", int64_t{-1});
  hang_ = plan.value("hang", false);
  rendezvous_ = plan.value("rendezvous", false);
  interrupt_at_ = plan.value("interrupt_at", int64_t{-1});
  log_every_ = std::max<int64_t>(1, plan.value("log_every", int64_t{1}));
  evaluate_at_end_ = plan.value("evaluate_at_end", false);
  std::this_thread::sleep_for(std::chrono::milliseconds(plan.value("load_ms", int64_t{0})));
  return absl::OkStatus();
}

absl::Status SleepyTestRunner::Run() {
  ++counters_->running;
  struct Leave {
    RunnerCounters* counters;
    ~Leave() { --counters->running; }
  } leave{counters_.get()};
  if (rendezvous_) {
    const std::string key = absl::StrCat("node/", context_.node);
    if (auto status = context_.kv->Set(key, absl::StrCat("hello from ", context_.node)); !status.ok()) return status;
    std::vector<std::string> keys;
    for (const WorkerSlot& slot : context_.slots) keys.push_back(absl::StrCat("node/", slot.node));
    auto values = context_.kv->Wait(keys, absl::Seconds(10));
    if (!values.ok()) return values.status();
    context_.report_log(absl::StrCat("met ", values->size(), " nodes"));
  }
  context_.report_log(absl::StrCat("node ", context_.node, " starts ", iterations_, " iterations"));
  std::unique_lock<std::mutex> lock(mu_);
  for (int64_t i = 0; hang_ || i < iterations_; ++i) {
    if (cancelled_cv_.wait_for(lock, std::chrono::milliseconds(step_ms_), [this] { return !cancel_reason_.ok(); })) {
      ++counters_->cancelled;
      return cancel_reason_;
    }
    if (i == fail_at_) return absl::InternalError(absl::StrCat("test runner: failing at iteration ", i, " as told"));
    // Stopped at this boundary by its process's signal, as the engine says it.
    if (i == interrupt_at_) return absl::CancelledError(absl::StrCat("interrupted at iteration ", i));
    if (hang_) continue;
    lock.unlock();
    if (context_.report_progress) context_.report_progress(i + 1);
    // Like the engine, one node (here node 0) speaks for the job.
    if (context_.node == 0 && (i + 1) % log_every_ == 0)
      context_.report_metrics(
          {i + 1, {{"loss", 10.0 / static_cast<double>(i + 1)}, {"samples_per_s", 8.0}, {"tokens_per_s", 1000.0}}});
    lock.lock();
  }
  lock.unlock();
  // An evaluation's row, as the engine reports it: its values alone.
  if (evaluate_at_end_ && context_.node == 0) context_.report_metrics({iterations_, {{"eval_loss", 1.25}}});
  context_.report_log(absl::StrCat("node ", context_.node, " done"));
  return absl::OkStatus();
}

void SleepyTestRunner::Cancel(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancel_reason_.ok()) cancel_reason_ = reason.ok() ? absl::CancelledError("cancelled") : reason;
  }
  cancelled_cv_.notify_all();
}

PlanRunnerFactory SleepyRunnerFactory(std::shared_ptr<RunnerCounters> counters) {
  return [counters] { return std::make_unique<SleepyTestRunner>(counters); };
}

}  // namespace tessera::cluster::testing
