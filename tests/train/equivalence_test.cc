// The acceptance test of multi-device training: gpt2_nano (4 layers, dropout
// on) trained 10 steps under every parallel layout gives, step for step, the
// losses of one device with the same global batch (DESIGN §4: randomness is
// layout-invariant, loss normalisation is by the global batch).

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/config.h"
#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera {
namespace {

constexpr int kSteps = 10;

absl::StatusOr<std::vector<double>> TrainGpt2(std::vector<std::string> overrides) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_equivalence_" + std::to_string(::getpid()));
  overrides.insert(overrides.end(), {"model.num_layers=4", "train.train_iter=" + std::to_string(kSteps),
                                     "train.log_period=100", "train.output_dir=" + dir.string()});
  auto config = LoadJobConfig(::tessera::testing::SourcePath("configs/gpt2_nano.json"), overrides);
  if (!config.ok()) return config.status();
  auto summary = Train(*config);
  std::filesystem::remove_all(dir);
  if (!summary.ok()) return summary.status();
  return summary->losses;
}

struct Layout {
  const char* name;
  std::vector<std::string> overrides;  // global batch 8 in every one
};

TEST(Equivalence, Gpt2NanoLossesMatchOneDeviceUnderEveryLayout) {
  auto one = TrainGpt2({"train.train_micro_batch_size=8", "train.num_accumulation_steps=1"});
  ASSERT_TRUE(one.ok()) << one.status();
  const auto dist = [](int dp, int tp, int pp) {
    return std::vector<std::string>{"train.dist.data_parallel_size=" + std::to_string(dp),
                                    "train.dist.tensor_parallel_size=" + std::to_string(tp),
                                    "train.dist.pipeline_parallel_size=" + std::to_string(pp)};
  };
  const auto with = [](std::vector<std::string> a, std::vector<std::string> b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<Layout> layouts = {
      {"DP 4", with(dist(4, 1, 1), {"train.train_micro_batch_size=2", "train.num_accumulation_steps=1"})},
      {"TP 4", with(dist(1, 4, 1), {"train.train_micro_batch_size=8", "train.num_accumulation_steps=1"})},
      {"PP 4, 4 micro-batches", with(dist(1, 1, 4), {"train.train_micro_batch_size=2", "train.num_accumulation_steps=4"})},
      {"2x2x1", with(dist(2, 2, 1), {"train.train_micro_batch_size=4", "train.num_accumulation_steps=1"})},
      {"2x1x2", with(dist(2, 1, 2), {"train.train_micro_batch_size=2", "train.num_accumulation_steps=2"})},
      {"1x2x2", with(dist(1, 2, 2), {"train.train_micro_batch_size=4", "train.num_accumulation_steps=2"})},
      {"2x2x2", with(dist(2, 2, 2), {"train.train_micro_batch_size=2", "train.num_accumulation_steps=2"})},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    auto losses = TrainGpt2(layout.overrides);
    ASSERT_TRUE(losses.ok()) << losses.status();
    ASSERT_EQ(losses->size(), one->size());
    for (size_t i = 0; i < one->size(); ++i) {
      EXPECT_NEAR((*losses)[i], (*one)[i], 1e-4 * std::abs((*one)[i])) << "step " << i;
    }
  }
}

// The acceptance command: 8 virtual CPU devices (data 2 x tensor 2 x
// pipeline 2, micro-batch 2, 2 micro-batches) against one device with the
// same global batch, through the CLI and metrics.jsonl.
TEST(Equivalence, AcceptanceCommandMatchesOneDeviceMetrics) {
  using ::tessera::testing::RunTessera;
  using ::tessera::testing::SourcePath;
  const auto base = std::filesystem::temp_directory_path() / ("tessera_acceptance_" + std::to_string(::getpid()));
  const std::string common = "train " + SourcePath("configs/gpt2_nano.json") + " train.train_iter=10 train.log_period=1";
  const auto parallel = RunTessera(common + " train.output_dir=" + (base / "parallel").string() +
                                   " train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2"
                                   " train.dist.pipeline_parallel_size=2 train.train_micro_batch_size=2"
                                   " train.num_accumulation_steps=2");
  ASSERT_EQ(parallel.exit_code, 0) << parallel.out;
  const auto single = RunTessera(common + " train.output_dir=" + (base / "single").string() +
                                 " train.train_micro_batch_size=8 train.num_accumulation_steps=1");
  ASSERT_EQ(single.exit_code, 0) << single.out;
  const auto losses = [](const std::filesystem::path& file) {
    std::vector<double> out;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return out;
  };
  const std::vector<double> a = losses(base / "parallel" / "metrics.jsonl");
  const std::vector<double> b = losses(base / "single" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::abs(b[i])) << "step " << i;
  // `tessera plan` names the conversion and collective of every boxing edge
  // and the quota of every pipeline buffer.
  const auto plan = RunTessera("plan " + SourcePath("configs/gpt2_nano.json") +
                               " train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2"
                               " train.dist.pipeline_parallel_size=2 train.train_micro_batch_size=2"
                               " train.num_accumulation_steps=2 --format json");
  ASSERT_EQ(plan.exit_code, 0) << plan.out.substr(0, 500);
  const nlohmann::json j = nlohmann::json::parse(plan.out);
  int boxing = 0, recv = 0;
  std::map<uint64_t, std::string> kind_of;
  for (const auto& actor : j["actors"]) {
    kind_of[actor["id"].get<uint64_t>()] = actor["kind"].get<std::string>();
    if (actor["kind"] == "COLLECTIVE") {
      ++boxing;
      EXPECT_NE(actor["boxing"]["conversion"].get<std::string>().find("->"), std::string::npos) << actor.dump();
    }
  }
  for (const auto& desc : j["registers"]) {
    if (kind_of[desc["producer"].get<uint64_t>()] != "RECV") continue;
    ++recv;
    EXPECT_GE(desc["quota"].get<int>(), 2) << desc.dump();
  }
  EXPECT_GT(boxing, 0);
  EXPECT_GT(recv, 0);
  EXPECT_NE(j["devices"].get<std::string>().find("8 ranks"), std::string::npos) << j["devices"];
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace tessera
