// The memory planner on real models (comm/proto/memory_plan.h): gpt2_nano
// under several layouts trains with its registers in per-device arenas whose
// bytes are shared between registers the protocol keeps apart. ctest runs
// every test with TESSERA_CHECK_ARENA=1, so each run here also had its plan
// checked against the protocol at load and its arenas watched while it ran
// (a register taken while another sharing its bytes was in use fails it;
// registers handed back are poisoned with NaN bytes).

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/proto/memory_plan.h"
#include "core/text.h"
#include "tests/cli_runner.h"
#include "tests/deadline.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera {
namespace {

struct Run {
  TrainSummary summary;
  proto::Plan plan;
};

absl::StatusOr<Run> TrainNano(std::vector<std::string> overrides, int steps = 3) {
  const auto dir = std::filesystem::temp_directory_path() / StrCat("tessera_memory_", ::getpid());
  overrides.push_back(StrCat("train.train_iter=", steps));
  overrides.push_back("train.log_period=100");
  overrides.push_back(StrCat("train.output_dir=", dir.string()));
  auto config = LoadJobConfig(::tessera::testing::SourcePath("configs/gpt2_nano.json"), overrides);
  if (!config.ok()) return config.status();
  Run run;
  auto plan = TrainingPlan(*config);
  if (!plan.ok()) return plan.status();
  run.plan = *std::move(plan);
  absl::StatusOr<TrainSummary> summary;
  {
    ::tessera::testing::Deadline deadline(std::chrono::seconds(120), "training gpt2_nano");
    summary = Train(*config);
  }
  std::filesystem::remove_all(dir);
  if (!summary.ok()) return summary.status();
  run.summary = *std::move(summary);
  return run;
}

struct Layout {
  const char* name;
  std::vector<std::string> overrides;
  // The most the arena may exceed the live peak by. Without accumulation an
  // iteration's forward waits for the previous update, so little overlaps
  // that the planner must keep apart: the target of 1.25x holds. With
  // micro-batches, the protocol lets micro-batch p + 1's forward run during
  // p's last backward ops (a wte gradient, say), so more must stay apart
  // than one run's peak shows (measured: 1.66 and 2.0 on gpt2_nano).
  double most_over_peak;
};

const std::vector<Layout> kLayouts = {
    {"one device", {}, 1.25},
    {"data 2 x tensor 2",
     {"train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2", "train.train_micro_batch_size=8"},
     1.25},
    {"accumulation 4", {"train.train_micro_batch_size=4", "train.num_accumulation_steps=4"}, 2.2},
    {"pipeline 2 x acc 4",
     {"train.dist.pipeline_parallel_size=2", "train.train_micro_batch_size=4", "train.num_accumulation_steps=4"},
     2.2},
};

// Every layout trains (checked arenas), the arenas share bytes, and each
// arena is close to the most bytes its registers had in use at once.
TEST(MemoryPlan, ArenasShareBytesAndStayNearTheLivePeak) {
  for (const Layout& layout : kLayouts) {
    SCOPED_TRACE(layout.name);
    auto run = TrainNano(layout.overrides);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_TRUE(comm::CheckMemoryPlan(run->plan).ok());
    ASSERT_FALSE(run->plan.memory_estimate().empty());
    for (const auto& m : run->plan.memory_estimate()) {
      SCOPED_TRACE(m.device());
      const int64_t unshared = m.gradients() + m.activations();
      EXPECT_EQ(m.unplanned(), 0);
      EXPECT_EQ(m.bytes(), m.parameters() + m.optimizer_state() + m.arena());
      EXPECT_LT(m.arena(), unshared * 19 / 20) << "arena " << m.arena() << " of " << unshared << " unshared bytes";
    }
    ASSERT_EQ(run->summary.arenas.size(), static_cast<size_t>(run->plan.arenas_size()));
    for (const auto& use : run->summary.arenas) {
      std::printf("%-22s cpu:%u arena %8.3f MiB, live peak %8.3f MiB, ratio %.3f\n", layout.name, use.device_index,
                  static_cast<double>(use.arena_bytes) / (1 << 20), static_cast<double>(use.peak_bytes) / (1 << 20),
                  static_cast<double>(use.arena_bytes) / static_cast<double>(use.peak_bytes));
      EXPECT_GT(use.peak_bytes, 0);
      EXPECT_LE(use.peak_bytes, use.arena_bytes);
      EXPECT_LE(static_cast<double>(use.arena_bytes), layout.most_over_peak * static_cast<double>(use.peak_bytes));
    }
  }
}

}  // namespace
}  // namespace tessera
