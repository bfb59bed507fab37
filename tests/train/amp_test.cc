// Mixed precision (train.amp): gpt2_nano with bf16 or fp16 matmuls gives the
// one-device losses of the same dtype under data, tensor and pipeline
// parallelism, with ZeRO and activation checkpointing (rtol 2e-2; in
// practice far closer), and so does its fused attention in bf16 / fp16, and follows the f32 loss curve within 5% over
// 50 iterations; fp16's dynamic loss scaling skips a step whose gradients overflowed (weights untouched) and halves the
// scale.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "core/text.h"
#include "tests/train/train_runs.h"

namespace tessera {
namespace {

using ::tessera::testing::LoggedLosses;

absl::StatusOr<std::vector<double>> NanoLosses(std::vector<std::string> overrides, int steps) {
  overrides.push_back("model.num_layers=2");
  auto run = ::tessera::testing::PlanAndTrain("configs/gpt2_nano.json", std::move(overrides), steps);
  if (!run.ok()) return run.status();
  return run->summary.losses;
}

// Each layout's losses (over `overrides` too) against the one-device ones
// `one`, relatively within `rtol`.
void ExpectOneDeviceLosses(const std::vector<std::vector<std::string>>& layouts,
                           const std::vector<std::string>& overrides, const std::vector<double>& one, double rtol) {
  for (std::vector<std::string> layout : layouts) {
    SCOPED_TRACE(absl::StrJoin(layout, " "));
    layout.insert(layout.end(), overrides.begin(), overrides.end());
    auto losses = NanoLosses(layout, 4);
    ASSERT_TRUE(losses.ok()) << losses.status();
    ASSERT_EQ(losses->size(), one.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_NEAR((*losses)[i], one[i], rtol * std::abs(one[i])) << "iteration " << i;
  }
}

class AmpDType : public ::testing::TestWithParam<std::string> {};

TEST_P(AmpDType, GivesTheOneDeviceLossesUnderEveryLayout) {
  const std::vector<std::string> amp = {"train.amp.enabled=true", "train.amp.dtype=" + GetParam()};
  const auto with = [&amp](std::vector<std::string> layout) {
    layout.insert(layout.end(), amp.begin(), amp.end());
    return layout;
  };
  auto one = NanoLosses(with({"train.train_micro_batch_size=8"}), 4);
  ASSERT_TRUE(one.ok()) << one.status();
  auto f32 = NanoLosses({"train.train_micro_batch_size=8"}, 4);
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_NE(*one, *f32);  // the products were rounded
  const std::vector<std::vector<std::string>> layouts = {
      {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=4"},
      {"train.dist.tensor_parallel_size=2", "train.train_micro_batch_size=8"},
      {"train.dist.pipeline_parallel_size=2", "train.train_micro_batch_size=4", "train.num_accumulation_steps=2"},
      {"train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2",
       "train.train_micro_batch_size=2", "train.num_accumulation_steps=2"},
      {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=4", "train.zero_optimization.enabled=true",
       "train.zero_optimization.stage=3", "train.activation_checkpoint.enabled=true"},
      // The passes after autodiff drop fp16's scaled loss here (read out of
      // bounds until the engine stopped remapping it: a crash in Compile).
      {"train.dist.data_parallel_size=2", "train.dist.pipeline_parallel_size=2", "train.train_micro_batch_size=2",
       "train.num_accumulation_steps=2", "train.zero_optimization.enabled=true", "train.zero_optimization.stage=3",
       "train.activation_checkpoint.enabled=true"},
  };
  // rtol 2e-2 is the issue's; 1e-3 is looser than seen.
  ExpectOneDeviceLosses(layouts, amp, *one, 1e-3);
}

// Accumulation over a number of micro-batches that is no power of 2 gives
// the one-device losses as data parallelism does: each micro-batch's
// backward starts from 1/m, so its 16-bit values round as the whole
// batch's do (the 1/m applied after the sum left them 1.7e-4 apart by the
// 4th iteration; data parallelism over the same split agreed).
TEST_P(AmpDType, AccumulationOverThreeMicroBatchesGivesTheOneDeviceLosses) {
  const auto losses = [](std::vector<std::string> layout) {
    for (const char* o :
         {"model.hidden_sizes=[7,5,3]", "model.in_features=5", "model.num_classes=3", "train.amp.enabled=true"}) {
      layout.push_back(o);
    }
    return layout;
  };
  const std::string dtype = "train.amp.dtype=" + GetParam();
  auto one =
      ::tessera::testing::PlanAndTrain("configs/mlp_demo.json", losses({dtype, "train.train_micro_batch_size=12"}), 6);
  ASSERT_TRUE(one.ok()) << one.status();
  for (const std::vector<std::string>& layout :
       std::vector<std::vector<std::string>>{{"train.train_micro_batch_size=4", "train.num_accumulation_steps=3"},
                                             {"train.train_micro_batch_size=4", "train.dist.data_parallel_size=3"}}) {
    SCOPED_TRACE(absl::StrJoin(layout, " "));
    std::vector<std::string> overrides = layout;
    overrides.push_back(dtype);
    auto run = ::tessera::testing::PlanAndTrain("configs/mlp_demo.json", losses(overrides), 6);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->summary.losses.size(), one->summary.losses.size());
    for (size_t i = 0; i < one->summary.losses.size(); ++i) {
      // (The reported loss is the mean of the micro-batches': ~1e-7 apart.)
      EXPECT_NEAR(run->summary.losses[i], one->summary.losses[i], 1e-6 * std::abs(one->summary.losses[i]))
          << "iteration " << i;
    }
  }
}

TEST_P(AmpDType, FollowsTheF32LossCurve) {
  auto f32 = NanoLosses({}, 50);
  ASSERT_TRUE(f32.ok()) << f32.status();
  auto bf16 = NanoLosses({"train.amp.enabled=true", "train.amp.dtype=" + GetParam()}, 50);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_EQ(bf16->size(), 50u);
  ASSERT_EQ(f32->size(), 50u);
  double worst = 0;
  for (size_t i = 0; i < 50; ++i) {
    const double relative = std::abs((*bf16)[i] - (*f32)[i]) / std::abs((*f32)[i]);
    worst = std::max(worst, relative);
    EXPECT_LT(relative, 0.05) << "iteration " << i;
  }
  EXPECT_LT(f32->back(), f32->front());
  EXPECT_LT(bf16->back(), bf16->front());
  std::printf("50 iterations: f32 %.4f -> %.4f, %s %.4f -> %.4f, largest relative gap %.2e\n", f32->front(),
              f32->back(), GetParam().c_str(), bf16->front(), bf16->back(), worst);
}

// model.fused_attention under mixed precision: the fused op reads q, k, v
// in bf16 / fp16 (graph/passes/amp.cc) and gives 16-bit dq, dk, dv, partial
// sums where the layout splits its queries; the one-device losses hold
// under tensor, data and pipeline parallelism and accumulation, and stay
// near the unfused attention's (which rounds the probabilities for their
// product with v, where the fused op on CPUs keeps them in f32).
TEST_P(AmpDType, FusedAttentionGivesTheOneDeviceLossesUnderLayouts) {
  const std::vector<std::string> amp = {"train.amp.enabled=true", "train.amp.dtype=" + GetParam()};
  const auto with = [&amp](std::vector<std::string> layout, bool fused = true) {
    layout.insert(layout.end(), amp.begin(), amp.end());
    if (fused) layout.push_back("model.fused_attention=true");
    return layout;
  };
  auto one = NanoLosses(with({"train.train_micro_batch_size=8"}), 4);
  ASSERT_TRUE(one.ok()) << one.status();
  auto unfused = NanoLosses(with({"train.train_micro_batch_size=8"}, false), 4);
  ASSERT_TRUE(unfused.ok()) << unfused.status();
  ASSERT_EQ(unfused->size(), one->size());
  for (size_t i = 0; i < one->size(); ++i) {
    EXPECT_NEAR((*unfused)[i], (*one)[i], 2e-2 * std::abs((*one)[i])) << "unfused, iteration " << i;
  }
  const std::vector<std::vector<std::string>> layouts = {
      {"train.dist.tensor_parallel_size=2", "train.train_micro_batch_size=8"},
      {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=4"},
      {"train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2",
       "train.train_micro_batch_size=2", "train.num_accumulation_steps=2"},
  };
  ExpectOneDeviceLosses(layouts, with({}), *one, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Amp, AmpDType, ::testing::Values("bf16", "fp16"));

// `tessera train` with fp16 and a loss scale so large that the fp16
// gradients overflow: each step is skipped and halves the scale, as
// metrics.jsonl records; a skipped step leaves the weights as they were (a
// run loading the one-step checkpoint sees the same first loss), a taken
// one does not.
// A model whose loss has no pipeline layer (models.MLP's): fp16's scale
// variables and their update are on the last stage. Its variables followed
// their earliest reader to stage 0, and every pipeline was refused ("the
// update of '' needs boxing").
TEST(Amp, Fp16PipelinesAModelWhoseLossHasNoLayer) {
  const std::vector<std::string> fp16 = {"train.amp.enabled=true", "train.amp.dtype=fp16"};
  auto one = ::tessera::testing::PlanAndTrain("configs/mlp_demo.json", fp16, 4);
  ASSERT_TRUE(one.ok()) << one.status();
  for (const char* stages : {"2", "3"}) {
    std::vector<std::string> pipeline = fp16;
    pipeline.push_back(std::string("train.dist.pipeline_parallel_size=") + stages);
    auto run = ::tessera::testing::PlanAndTrain("configs/mlp_demo.json", pipeline, 4);
    ASSERT_TRUE(run.ok()) << stages << " stages: " << run.status();
    EXPECT_EQ(run->summary.losses, one->summary.losses) << stages << " stages";
  }
}

TEST(Amp, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  const auto root = std::filesystem::temp_directory_path() / StrCat("tessera_amp_", ::getpid());
  std::filesystem::remove_all(root);
  const auto train = [](const std::filesystem::path& dir, const std::string& overrides) {
    const auto result = ::tessera::testing::RunTessera(
        "train " + ::tessera::testing::SourcePath("configs/gpt2_nano.json") +
        " model.num_layers=2 train.amp.enabled=true train.amp.dtype=fp16 train.log_period=1 train.output_dir=" +
        dir.string() + " " + overrides);
    EXPECT_EQ(result.exit_code, 0) << result.out;
  };
  train(root / "overflow", "train.train_iter=3 train.amp.initial_loss_scale=1e9");
  std::vector<nlohmann::json> rows;
  {
    std::ifstream in(root / "overflow" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rows[i]["skipped"].get<double>(), 1.0) << i;
    EXPECT_EQ(rows[i]["skipped_steps"].get<double>(), static_cast<double>(i + 1)) << i;
    EXPECT_EQ(rows[i]["loss_scale"].get<double>(), 1e9 / static_cast<double>(1 << i)) << i;
  }
  // One step, skipped or (at the default scale) taken, then its checkpoint's
  // weights loaded into a fresh run: the same first loss only when skipped.
  train(root / "skipped", "train.train_iter=1 train.amp.initial_loss_scale=1e9");
  train(root / "taken", "train.train_iter=1");
  const auto first_loss = [](const std::filesystem::path& dir) { return LoggedLosses(dir).at(1); };
  train(root / "from_skipped",
        "train.train_iter=1 train.load_weight=" + (root / "skipped" / "checkpoints" / "iter_0000001").string());
  train(root / "from_taken",
        "train.train_iter=1 train.load_weight=" + (root / "taken" / "checkpoints" / "iter_0000001").string());
  const std::map<int64_t, double> taken = LoggedLosses(root / "taken");
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(LoggedLosses(root / "skipped").at(1), taken.at(1));
  EXPECT_EQ(first_loss(root / "from_skipped"), taken.at(1));
  EXPECT_LT(first_loss(root / "from_taken"), taken.at(1));
  // Clean steps grow the scale every loss_scale_growth_interval steps.
  train(root / "growth", "train.train_iter=5 train.amp.loss_scale_growth_interval=2");
  std::vector<double> scales;
  {
    std::ifstream in(root / "growth" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) scales.push_back(nlohmann::json::parse(line)["loss_scale"]);
  }
  EXPECT_EQ(scales, (std::vector<double>{65536, 65536, 131072, 131072, 262144}));
  std::filesystem::remove_all(root);
}

// fp16 under gradient accumulation (one device, and a pipeline's
// micro-batches): the scale grows each clean step until the gradients
// overflow, and the same steps overflow as in one pass over the whole
// batch, so the scales, the skips and the losses follow the one-pass run
// (each micro-batch's loss is divided by their number before scaling; it
// overflowed at a scale N times smaller).
TEST(Amp, Fp16SkipsTheSameStepsWhateverTheMicroBatches) {
  const auto root = std::filesystem::temp_directory_path() / StrCat("tessera_amp_micro_", ::getpid());
  std::filesystem::remove_all(root);
  const auto rows = [&root](const std::string& name, const std::string& overrides) {
    const auto result = ::tessera::testing::RunTessera(
        "train " + ::tessera::testing::SourcePath("configs/gpt2_nano.json") +
        " model.num_layers=2 train.train_iter=12 lr_scheduler._target_=ConstantLR train.global_batch_size=16"
        " train.num_accumulation_steps=null train.amp.enabled=true train.amp.dtype=fp16"
        " train.amp.loss_scale_growth_interval=1 train.log_period=1 train.output_dir=" +
        (root / name).string() + " " + overrides);
    EXPECT_EQ(result.exit_code, 0) << result.out;
    std::vector<nlohmann::json> read;
    std::ifstream in(root / name / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) read.push_back(nlohmann::json::parse(line));
    return read;
  };
  const std::vector<nlohmann::json> one = rows("one", "train.train_micro_batch_size=16");
  ASSERT_EQ(one.size(), 12u);
  double skipped = 0;
  for (const nlohmann::json& row : one) skipped += row["skipped"].get<double>();
  ASSERT_GT(skipped, 0) << "no step overflowed: the test sees nothing";
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"micro", "train.train_micro_batch_size=4"},
      {"pipeline", "train.train_micro_batch_size=4 train.dist.pipeline_parallel_size=2"}};
  for (const auto& [name, layout] : layouts) {
    SCOPED_TRACE(layout);
    const std::vector<nlohmann::json> micro = rows(name, layout);
    ASSERT_EQ(micro.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_EQ(micro[i]["loss_scale"].get<double>(), one[i]["loss_scale"].get<double>()) << "iteration " << i + 1;
      EXPECT_EQ(micro[i]["skipped"].get<double>(), one[i]["skipped"].get<double>()) << "iteration " << i + 1;
      EXPECT_NEAR(micro[i]["loss"].get<double>(), one[i]["loss"].get<double>(), 1e-3 * one[i]["loss"].get<double>())
          << "iteration " << i + 1;
    }
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace tessera
