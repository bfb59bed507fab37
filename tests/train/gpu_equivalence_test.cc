// gpt2_nano on GPUs (ctest labels train, cuda): on one GPU the CPU's losses
// (f32, TF32 off: rtol 1e-4), and under data, tensor and pipeline
// parallelism over the GPUs this process sees (collectives and transfers on
// NCCL, boxing on the GPUs) the one-GPU losses (rtol 1e-5: the GEMMs of a
// shard may take other cuBLAS algorithms than the whole's). Each case skips
// with the reason where the GPUs are missing.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "comm/proto/pipeline_schedule.h"
#include "core/status.h"
#include "core/text.h"
#include "tests/gpus.h"
#include "tests/train/train_runs.h"

namespace tessera {
namespace {

constexpr int kSteps = 10;

using testing::MissingGpus;

// gpt2_nano (4 layers) trained kSteps with `overrides`: its losses.
absl::StatusOr<std::vector<double>> TrainGpt2(std::vector<std::string> overrides) {
  overrides.push_back("model.num_layers=4");
  ASSIGN_OR_RETURN(testing::PlannedRun run, testing::PlanAndTrain("configs/gpt2_nano.json", overrides, kSteps));
  return run.summary.losses;
}

void ExpectClose(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                 double rtol) {
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << what;
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps)) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - want[i]), rtol * std::abs(want[i]))
        << what << " step " << i << ": " << got[i] << " vs " << want[i];
  }
}

const std::vector<std::string> kOneDevice = {"train.train_micro_batch_size=8", "train.num_accumulation_steps=1"};

std::vector<std::string> OnGpus(std::vector<std::string> overrides) {
  overrides.push_back("train.dist.device_type=cuda");
  return overrides;
}

// On GPUs a device launches its collectives and transfers in one lane, a
// transfer at the step of its reader on the receiving stage
// (actors/launch_order.h): the sender keeps each micro-batch's register
// until then, and a GPU plan gives it the registers that takes
// (comm::SenderRegisters), CPU plans (a lane per communicator) keep theirs.
// In GPT-2 every value crossing per micro-batch goes to a neighbour: the
// tied embedding's weight crosses from the first stage to the last, and its
// gradient back, once per iteration (graph::AccumulateGradients: a repeat
// and an accumulator on each stage), so no sender waits for a reader
// stages away. Planning only: no GPU needed.
TEST(GpuEquivalence, PipelineSendersOnGpusKeepEveryValueUntilItsReaderRuns) {
  const std::vector<std::vector<std::string>> layouts = {
      {"train.dist.pipeline_parallel_size=2", "train.train_micro_batch_size=2", "train.num_accumulation_steps=4"},
      {"train.dist.pipeline_parallel_size=4", "train.train_micro_batch_size=1", "train.num_accumulation_steps=8"},
      {"train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=4", "train.train_micro_batch_size=2",
       "train.num_accumulation_steps=4"}};
  for (const auto& layout : layouts) {
    SCOPED_TRACE(Join(layout, " "));
    std::map<std::string, int32_t> registers_on_cpu;  // send -> its input's registers in the CPU plan
    for (const std::string device : {"cpu", "cuda"}) {
      std::vector<std::string> overrides = layout;
      overrides.push_back("model.num_layers=4");
      overrides.push_back("train.dist.device_type=" + device);
      auto job = LoadJobConfig(testing::SourcePath("configs/gpt2_nano.json"), overrides);
      ASSERT_TRUE(job.ok()) << job.status();
      auto plan = TrainingPlan(*job);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::map<uint64_t, const proto::Task*> tasks;
      for (const proto::Task& task : plan->tasks()) tasks[task.actor_id()] = &task;
      const int num_stages =
          std::find(layout.begin(), layout.end(), "train.dist.pipeline_parallel_size=2") != layout.end() ? 2 : 4;
      int tied_weight_sends = 0, tied_gradient_sends = 0, tied_accumulators = 0;
      for (const proto::Task& task : plan->tasks()) {
        if (task.kind() == proto::ACTOR_KIND_ACC && task.name().rfind("acc:accumulate/wte.weight:", 0) == 0) {
          ++tied_accumulators;
        }
        if (task.kind() != proto::ACTOR_KIND_SEND) continue;
        const int64_t stage = task.transfer().launch().stage(), peer = task.transfer().peer_stage();
        if (task.pieces_per_iteration() <= 1 && stage == 0 && peer == num_stages - 1 &&
            task.name().rfind("send:wte.weight:", 0) == 0) {
          ++tied_weight_sends;
        }
        // The head's accumulated gradient, or its tensor-parallel boxing.
        const proto::Task* made_by = &task;
        for (int up = 0; up < 3 && made_by->consumed_register_desc_ids_size() > 0; ++up) {
          made_by = tasks.at(plan->register_descs(static_cast<int>(made_by->consumed_register_desc_ids(0))).producer());
          if (made_by->kind() != proto::ACTOR_KIND_COLLECTIVE) break;
        }
        if (task.pieces_per_iteration() <= 1 && stage == num_stages - 1 && peer == 0 &&
            made_by->name().rfind("acc:accumulate/wte.weight:", 0) == 0) {
          ++tied_gradient_sends;
        }
        if (task.pieces_per_iteration() <= 1) continue;
        EXPECT_EQ(std::abs(peer - stage), 1)
            << task.name() << " crosses per micro-batch from stage " << stage << " to " << peer;
        const proto::RegisterDesc& input = plan->register_descs(static_cast<int>(task.consumed_register_desc_ids(0)));
        if (device == "cpu") {
          registers_on_cpu[task.name()] = input.register_num();
          continue;
        }
        const proto::LaunchOrder& launch = task.transfer().launch();
        const comm::OneFOneBClock clock(launch.num_stages(), task.pieces_per_iteration());
        const int32_t needed =
            comm::SenderRegisters(clock, launch.stage(), task.transfer().peer_stage(), launch.backward(),
                                  tasks.at(input.producer())->kind() == proto::ACTOR_KIND_COLLECTIVE);
        EXPECT_GE(input.register_num(), needed) << task.name();
        auto cpu = registers_on_cpu.find(task.name());
        ASSERT_NE(cpu, registers_on_cpu.end()) << task.name() << " is in the GPU plan only";
        EXPECT_EQ(input.register_num(), std::max(needed, cpu->second)) << task.name();
      }
      // Once per iteration, from each tensor-parallel rank: the weight to the
      // head, the head's accumulated gradient back; accumulated on both ends.
      const int tp = layout.size() == 4 ? 2 : 1;
      EXPECT_EQ(tied_weight_sends, tp);
      EXPECT_EQ(tied_gradient_sends, tp);
      EXPECT_EQ(tied_accumulators, 2 * tp);
    }
  }
}

TEST(GpuEquivalence, OneGpuGivesTheCpuLosses) {
  if (const std::string why = MissingGpus(1); !why.empty()) GTEST_SKIP() << why;
  auto cpu = TrainGpt2(kOneDevice);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = TrainGpt2(OnGpus(kOneDevice));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ExpectClose("cuda:0 against the CPU", *gpu, *cpu, 1e-4);
}

TEST(GpuEquivalence, LayoutsOverGpusGiveTheOneGpuLosses) {
  if (const std::string why = MissingGpus(2); !why.empty()) GTEST_SKIP() << why;
  auto one = TrainGpt2(OnGpus(kOneDevice));
  ASSERT_TRUE(one.ok()) << one.status();
  const auto dist = [](int dp, int tp, int pp, int micro, int acc) {
    return OnGpus({StrCat("train.dist.data_parallel_size=", dp), StrCat("train.dist.tensor_parallel_size=", tp),
                   StrCat("train.dist.pipeline_parallel_size=", pp), StrCat("train.train_micro_batch_size=", micro),
                   StrCat("train.num_accumulation_steps=", acc)});
  };
  struct Layout {
    const char* name;
    int gpus;
    std::vector<std::string> overrides;  // global batch 8 in every one
  };
  const std::vector<Layout> layouts = {{"DP 2", 2, dist(2, 1, 1, 4, 1)},
                                       {"TP 2", 2, dist(1, 2, 1, 8, 1)},
                                       {"PP 2, 4 micro-batches", 2, dist(1, 1, 2, 2, 4)},
                                       {"2x2x1", 4, dist(2, 2, 1, 4, 1)},
                                       {"2x2x2", 8, dist(2, 2, 2, 2, 2)}};
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    if (!MissingGpus(layout.gpus).empty()) continue;
    auto losses = TrainGpt2(layout.overrides);
    ASSERT_TRUE(losses.ok()) << losses.status();
    ExpectClose(layout.name, *losses, *one, 1e-5);
  }
}

}  // namespace
}  // namespace tessera
