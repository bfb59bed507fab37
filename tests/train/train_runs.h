// Helpers for tests that train configs in process or read what
// `tessera train` wrote.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/text.h"
#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"
#include "tests/deadline.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera::testing {

struct PlannedRun {
  TrainSummary summary;
  proto::Plan plan;  // TrainingPlan of the same config
};

// `config` (a path under the source tree) with `overrides`, `steps`
// iterations (log period 100) in a temporary output directory removed
// after: its plan, then the run (within 120 s).
inline absl::StatusOr<PlannedRun> PlanAndTrain(const std::string& config, std::vector<std::string> overrides,
                                               int steps) {
  const auto dir = std::filesystem::temp_directory_path() / StrCat("tessera_run_", ::getpid());
  overrides.push_back(StrCat("train.train_iter=", steps));
  overrides.push_back("train.log_period=100");
  overrides.push_back(StrCat("train.output_dir=", dir.string()));
  auto job = LoadJobConfig(SourcePath(config), overrides);
  if (!job.ok()) return job.status();
  PlannedRun run;
  auto plan = TrainingPlan(*job);
  if (!plan.ok()) return plan.status();
  run.plan = *std::move(plan);
  absl::StatusOr<TrainSummary> summary;
  {
    Deadline deadline(std::chrono::seconds(120), StrCat("training ", config));
    summary = Train(*job);
  }
  std::filesystem::remove_all(dir);
  if (!summary.ok()) return summary.status();
  run.summary = *std::move(summary);
  return run;
}

// The train rows of `dir`/metrics.jsonl: iteration -> loss.
inline std::map<int64_t, double> LoggedLosses(const std::filesystem::path& dir) {
  std::map<int64_t, double> out;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("loss")) out[row["iter"].get<int64_t>()] = row["loss"].get<double>();
  }
  return out;
}

}  // namespace tessera::testing
