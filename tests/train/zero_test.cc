// ZeRO (train.zero_optimization): stages 1-3 over data parallelism, alone
// and with tensor and pipeline parallelism and gradient accumulation, give
// plain data parallelism's losses, and each rank holds 1/dp of the optimizer
// state and of the variables, in the plan's estimate and in what the
// runtime's Parameter actors allocated.

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "comm/proto/memory_plan.h"
#include "core/text.h"
#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"
#include "tests/deadline.h"
#include "tests/train/train_runs.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera {
namespace {

using Run = ::tessera::testing::PlannedRun;
using ::tessera::testing::LoggedLosses;

absl::StatusOr<Run> TrainNano(std::vector<std::string> overrides, int steps = 4) {
  overrides.push_back("model.num_layers=2");
  return ::tessera::testing::PlanAndTrain("configs/gpt2_nano.json", std::move(overrides), steps);
}

std::vector<std::string> With(std::vector<std::string> layout, int stage) {
  if (stage > 0) {
    layout.push_back("train.zero_optimization.enabled=true");
    layout.push_back(StrCat("train.zero_optimization.stage=", stage));
  }
  return layout;
}

struct Layout {
  const char* name;
  std::vector<std::string> overrides;
};

const std::vector<Layout> kLayouts = {
    {"data 2", {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=8"}},
    {"data 2 x acc 2",
     {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=4", "train.num_accumulation_steps=2"}},
    {"data 2 x tensor 2",
     {"train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2", "train.train_micro_batch_size=8"}},
    {"data 2 x pipeline 2 x acc 2",
     {"train.dist.data_parallel_size=2", "train.dist.pipeline_parallel_size=2", "train.train_micro_batch_size=4",
      "train.num_accumulation_steps=2"}},
    {"data 2 x tensor 2 x pipeline 2 x acc 2",
     {"train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2",
      "train.train_micro_batch_size=2", "train.num_accumulation_steps=2"}},
};

// Plan-estimated and runtime-counted bytes per device, by device index.
struct Held {
  std::map<std::string, int64_t> plan_state, plan_parameters;
  std::map<uint32_t, int64_t> state, parameters;
};

Held HeldBytes(const Run& run) {
  Held held;
  for (const auto& m : run.plan.memory_estimate()) {
    held.plan_state[m.device()] = m.optimizer_state();
    held.plan_parameters[m.device()] = m.parameters();
  }
  for (const auto& use : run.summary.arenas) {
    held.state[use.device_index] = use.optimizer_state_bytes;
    held.parameters[use.device_index] = use.parameter_bytes;
  }
  return held;
}

int64_t Total(const std::map<std::string, int64_t>& bytes) {
  int64_t total = 0;
  for (const auto& [device, b] : bytes) total += b;
  return total;
}

// Every stage under every layout trains plain data parallelism's losses
// (rtol 1e-5), with 1/dp of the optimizer state and of the variables on
// each rank, as planned and as allocated.
TEST(Zero, EveryStageGivesPlainDataParallelLossesWithAShardPerRank) {
  for (const Layout& layout : kLayouts) {
    SCOPED_TRACE(layout.name);
    auto plain = TrainNano(layout.overrides);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_EQ(plain->summary.losses.size(), 4u);
    const Held whole = HeldBytes(*plain);
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE(StrCat("stage ", stage));
      auto zero = TrainNano(With(layout.overrides, stage));
      ASSERT_TRUE(zero.ok()) << zero.status();
      ASSERT_EQ(zero->summary.losses.size(), plain->summary.losses.size());
      for (size_t i = 0; i < plain->summary.losses.size(); ++i) {
        EXPECT_NEAR(zero->summary.losses[i], plain->summary.losses[i], 1e-5 * std::abs(plain->summary.losses[i]))
            << "iteration " << i;
      }
      const Held shard = HeldBytes(*zero);
      ASSERT_EQ(shard.plan_state.size(), whole.plan_state.size());
      // Each data-parallel pair of ranks splits what each of them held: the
      // bytes halve, but for what stays whole: the biases tensor
      // parallelism splits (no other axis to shard) and the constants
      // (never trained) among the parameters.
      const auto about_half = [](int64_t shard, int64_t whole) {
        // (A rank's shard of an odd length is one element short of half.)
        return std::abs(static_cast<double>(2 * shard - whole)) <= 0.02 * static_cast<double>(whole);
      };
      EXPECT_PRED2(about_half, Total(shard.plan_state), Total(whole.plan_state));
      EXPECT_PRED2(about_half, Total(shard.plan_parameters), Total(whole.plan_parameters));
      for (const auto& [device, bytes] : shard.plan_state) {
        EXPECT_PRED2(about_half, bytes, whole.plan_state.at(device)) << device;
      }
      // The runtime's Parameter actors allocated what the plan says.
      ASSERT_EQ(shard.state.size(), shard.plan_state.size());
      int64_t allocated = 0, allocated_parameters = 0;
      for (const auto& [device, bytes] : shard.state) allocated += bytes;
      for (const auto& [device, bytes] : shard.parameters) allocated_parameters += bytes;
      EXPECT_EQ(allocated, Total(shard.plan_state));
      EXPECT_EQ(allocated_parameters, Total(shard.plan_parameters));
      int64_t allocated_whole = 0;
      for (const auto& [device, bytes] : whole.state) allocated_whole += bytes;
      EXPECT_EQ(allocated_whole, Total(whole.plan_state));
      EXPECT_PRED2(about_half, allocated, allocated_whole);
    }
  }
}

// What each stage changes in the plan: stage 1 gathers each variable once
// per iteration and reduce-scatters its gradient; stage 2 reduce-scatters
// every micro-batch's gradient into a sharded accumulator (smaller arena);
// stage 3 gathers for every reader, in forward and again in backward.
TEST(Zero, StagesGatherAndScatterWhereTheySay) {
  const std::vector<std::string> layout = {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=4",
                                           "train.num_accumulation_steps=2",  "model.hidden_size=128",
                                           "model.ffn_hidden_size=512",       "model.seq_length=16"};
  const auto count = [](const proto::Plan& plan, const std::string& what) {
    int n = 0;
    for (const auto& task : plan.tasks()) n += task.name().find(what) != std::string::npos ? 1 : 0;
    return n;
  };
  const auto arena = [](const proto::Plan& plan) {
    int64_t bytes = 0;
    for (const auto& a : plan.arenas()) bytes += a.bytes();
    return bytes;
  };
  auto plain = TrainNano(layout, 2);
  auto one = TrainNano(With(layout, 1), 2);
  auto two = TrainNano(With(layout, 2), 2);
  auto three = TrainNano(With(layout, 3), 2);
  for (auto* run : {&plain, &one, &two, &three}) ASSERT_TRUE(run->ok()) << run->status();
  EXPECT_EQ(count(plain->plan, "zero3/"), 0);
  EXPECT_EQ(count(one->plan, "zero3/"), 0);
  EXPECT_GT(count(three->plan, "zero3/"), 0);
  {
    // Over one data-parallel rank nothing is sharded: stage 3 adds no
    // copies (it added one per reader of every weight).
    auto alone = TrainNano(With({"train.train_micro_batch_size=4", "model.hidden_size=128"}, 3), 1);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(count(alone->plan, "zero3/"), 0);
  }
  std::printf("arena bytes: plain %lld, stage 1 %lld, stage 2 %lld, stage 3 %lld\n",
              static_cast<long long>(arena(plain->plan)), static_cast<long long>(arena(one->plan)),
              static_cast<long long>(arena(two->plan)), static_cast<long long>(arena(three->plan)));
  // Stage 2's accumulators hold half the bytes of stage 1's.
  const auto accumulators = [](const proto::Plan& plan) {
    std::map<int64_t, const proto::RegisterDesc*> descs;
    for (const auto& desc : plan.register_descs()) descs[desc.id()] = &desc;
    int64_t bytes = 0;
    for (const auto& task : plan.tasks()) {
      if (task.kind() != proto::ACTOR_KIND_ACC || task.name().find("accumulate/") == std::string::npos) continue;
      for (int64_t id : task.produced_register_desc_ids()) {
        auto stride = comm::RegisterStride(*descs.at(id));
        EXPECT_TRUE(stride.ok()) << stride.status();
        bytes += stride.ok() ? *stride * descs.at(id)->register_num() : 0;
      }
    }
    return bytes;
  };
  const auto halved = [](int64_t two, int64_t one) { return 2 * two >= one && 2 * two <= one + one / 50; };
  EXPECT_GT(accumulators(one->plan), 0);
  EXPECT_PRED2(halved, accumulators(two->plan), accumulators(one->plan));
  {
    // Over two pipeline stages too, the tied embedding's accumulators on
    // both stages (graph::AccumulateGradients) included.
    std::vector<std::string> piped = layout;
    piped.push_back("train.dist.pipeline_parallel_size=2");
    auto piped_one = TrainNano(With(piped, 1), 1);
    auto piped_two = TrainNano(With(piped, 2), 1);
    for (auto* run : {&piped_one, &piped_two}) ASSERT_TRUE(run->ok()) << run->status();
    EXPECT_PRED2(halved, accumulators(piped_two->plan), accumulators(piped_one->plan));
  }
  // Stage 3 holds no variable gathered between its readers: a smaller arena
  // than stage 2's, which keeps each gathered from forward to backward.
  EXPECT_LT(arena(three->plan), arena(two->plan));
  for (const auto& m : three->plan.memory_estimate()) {
    SCOPED_TRACE(m.device());
    EXPECT_LT(m.bytes(), plain->plan.memory_estimate(0).bytes());
  }
}

// Gradient buckets (train.dist.gradient_bucket_mb, on by default for data
// parallelism without ZeRO or tensor parallelism): the same losses as one
// reduction per gradient, with far fewer collectives in the plan.
TEST(GradientBuckets, FewerCollectivesSameLosses) {
  const auto collectives = [](const proto::Plan& plan) {
    int n = 0;
    for (const auto& task : plan.tasks()) n += task.kind() == proto::ACTOR_KIND_COLLECTIVE ? 1 : 0;
    return n;
  };
  const std::vector<std::vector<std::string>> layouts = {
      {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=8"},
      {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=4", "train.num_accumulation_steps=2"},
      {"train.dist.data_parallel_size=2", "train.dist.pipeline_parallel_size=2", "train.train_micro_batch_size=4",
       "train.num_accumulation_steps=2"},
  };
  for (const auto& layout : layouts) {
    SCOPED_TRACE(absl::StrJoin(layout, " "));
    const auto with = [&layout](const std::string& mb) {
      std::vector<std::string> overrides = layout;
      overrides.push_back("train.dist.gradient_bucket_mb=" + mb);
      return overrides;
    };
    auto single = TrainNano(with("0"));
    auto one_bucket = TrainNano(with("25"));
    auto small = TrainNano(with("0.02"));  // 20 KiB: many buckets
    for (auto* run : {&single, &one_bucket, &small}) ASSERT_TRUE(run->ok()) << run->status();
    for (const auto* run : {&one_bucket, &small}) {
      ASSERT_EQ((*run)->summary.losses.size(), single->summary.losses.size());
      for (size_t i = 0; i < single->summary.losses.size(); ++i) {
        EXPECT_NEAR((*run)->summary.losses[i], single->summary.losses[i], 1e-5 * std::abs(single->summary.losses[i]));
      }
    }
    std::printf("collectives: %d one per gradient, %d in 25 MiB buckets, %d in 20 KiB buckets\n",
                collectives(single->plan), collectives(one_bucket->plan), collectives(small->plan));
    EXPECT_LT(collectives(one_bucket->plan), collectives(small->plan));
    EXPECT_LT(collectives(small->plan), collectives(single->plan));
  }
}

// A checkpoint written under ZeRO-3 (variables and state sharded over the
// data-parallel ranks) resumes without ZeRO to the losses of an
// uninterrupted plain run: `tessera train`, 4 iterations, a checkpoint at 2.
TEST(Zero, CheckpointsResumeUnderAnotherLayout) {
  const auto root = std::filesystem::temp_directory_path() / StrCat("tessera_zero_resume_", ::getpid());
  std::filesystem::remove_all(root);
  const auto train = [](const std::filesystem::path& dir, const std::string& overrides) {
    const auto result = ::tessera::testing::RunTessera(
        "train " + ::tessera::testing::SourcePath("configs/gpt2_nano.json") +
        " model.num_layers=2 train.dist.data_parallel_size=2 train.train_micro_batch_size=8 train.train_iter=4"
        " train.log_period=1 train.checkpointer.period=2 train.output_dir=" +
        dir.string() + " " + overrides);
    EXPECT_EQ(result.exit_code, 0) << result.out;
  };
  train(root / "plain", "");
  train(root / "zero", "train.zero_optimization.enabled=true train.zero_optimization.stage=3");
  const std::map<int64_t, double> plain = LoggedLosses(root / "plain"), zero = LoggedLosses(root / "zero");
  std::filesystem::remove_all(root / "zero" / "checkpoints" / "iter_0000004");
  train(root / "zero", "train.resume=true");
  const std::map<int64_t, double> resumed = LoggedLosses(root / "zero");
  std::filesystem::remove_all(root);
  ASSERT_EQ(plain.size(), 4u);
  ASSERT_EQ(zero.size(), 4u);
  ASSERT_EQ(resumed.size(), 4u);
  for (int64_t i = 1; i <= 4; ++i) {
    EXPECT_NEAR(zero.at(i), plain.at(i), 1e-5 * std::abs(plain.at(i))) << "iteration " << i;
    EXPECT_NEAR(resumed.at(i), plain.at(i), 1e-5 * std::abs(plain.at(i))) << "iteration " << i;
  }
}

}  // namespace
}  // namespace tessera
