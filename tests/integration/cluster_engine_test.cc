// The cluster with the engine behind it: a master (the engine's compiler)
// and two workers (the engine's runners, 2 CPU devices each) in this
// process, talking gRPC on 127.0.0.1; gpt2_nano submitted under several
// layouts spanning both workers gives the losses of `Train` in one process,
// and the master writes the trainer's outputs.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "actors/plan.h"
#include "cluster/engine_job.h"
#include "core/config.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/deadline.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera::cluster {
namespace {

constexpr int kSteps = 4;

std::string SourcePath(const std::string& relative) { return std::string(TESSERA_SOURCE_DIR) + "/" + relative; }

struct EngineCluster {
  std::unique_ptr<Master> master;
  std::vector<std::unique_ptr<Worker>> workers;
  std::unique_ptr<Client> client;

  void Start() {
    master = std::make_unique<Master>(testing::FastMasterOptions(), MakeEngineJobCompiler());
    auto address = master->Start();
    ASSERT_TRUE(address.ok()) << address.status();
    EngineRunnerOptions runner;
    runner.intra_op_threads = 1;
    for (int i = 0; i < 2; ++i) {
      workers.push_back(std::make_unique<Worker>(testing::FastWorkerOptions(*address, "cpu:2"),
                                                 MakeEnginePlanRunnerFactory(runner)));
      ASSERT_TRUE(workers.back()->Start().ok());
    }
    Client::Options options;
    options.master = *address;
    client = std::make_unique<Client>(options);
    ASSERT_TRUE(testing::WaitUntil([&] { return workers[0]->registered() && workers[1]->registered(); }));
  }
  // Submits a job and waits for it to succeed.
  void RunJob(const std::string& config, const std::vector<std::string>& overrides) {
    auto job = client->Submit(config, overrides);
    ASSERT_TRUE(job.ok()) << job.status();
    control::JobInfo info;
    ASSERT_TRUE(testing::WaitUntil(
        [&] {
          auto got = client->Get(*job);
          if (got.ok()) info = *got;
          return got.ok() && (info.state() == control::SUCCEEDED || info.state() == control::FAILED ||
                              info.state() == control::CANCELLED);
        },
        absl::Seconds(120)));
    ASSERT_EQ(info.state(), control::SUCCEEDED) << info.DebugString();
  }
  ~EngineCluster() {
    for (auto& w : workers) w->Shutdown();
    if (master) master->Shutdown();
  }
};

std::vector<std::string> Overrides(const std::filesystem::path& out, std::vector<std::string> layout) {
  layout.insert(layout.end(), {"model.num_layers=2", "train.train_iter=" + std::to_string(kSteps), "train.log_period=1",
                               "train.output_dir=" + out.string(), "train.dist.intra_op_threads=1"});
  return layout;
}

std::vector<double> LossesOf(const std::filesystem::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

class ClusterEngine : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(ClusterEngine, SubmittedJobGivesTheSingleProcessLosses) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_cluster_engine_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto local = LoadJobConfig(SourcePath("configs/gpt2_nano.json"), Overrides(dir / "local", GetParam()));
  ASSERT_TRUE(local.ok()) << local.status();
  std::vector<double> expected;
  {
    ::tessera::testing::Deadline deadline(std::chrono::seconds(120), "training in one process");
    auto summary = Train(*local);
    ASSERT_TRUE(summary.ok()) << summary.status();
    expected = summary->losses;
  }
  EngineCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto files = config::LoadConfigFiles(SourcePath("configs/gpt2_nano.json"));
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_NO_FATAL_FAILURE(cluster.RunJob(files->dump(), Overrides(dir / "cluster", GetParam())));
  const std::vector<double> losses = LossesOf(dir / "cluster" / "metrics.jsonl");
  ASSERT_EQ(losses.size(), expected.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    // metrics.jsonl holds the float loss printed as a double: identical values.
    EXPECT_NEAR(losses[i], expected[i], 1e-6 * std::abs(expected[i])) << "step " << i;
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "cluster" / "config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "cluster" / "log.txt"));
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ClusterEngine,
                         ::testing::Values(std::vector<std::string>{"train.dist.data_parallel_size=4"},
                                           std::vector<std::string>{"train.dist.data_parallel_size=2",
                                                                    "train.dist.tensor_parallel_size=2"},
                                           std::vector<std::string>{"train.dist.data_parallel_size=2",
                                                                    "train.dist.pipeline_parallel_size=2",
                                                                    "train.num_accumulation_steps=2"}));

// A config the schema refuses comes back as INVALID_ARGUMENT carrying the
// config error.
TEST(ClusterEngineErrors, MalformedConfigIsInvalidArgumentWithTheConfigError) {
  EngineCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto files = config::LoadConfigFiles(SourcePath("configs/gpt2_nano.json"));
  ASSERT_TRUE(files.ok()) << files.status();
  auto job = cluster.client->Submit(files->dump(), {"train.train_iters=3"});
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
  EXPECT_NE(job.status().message().find("did you mean 'train.train_iter'"), std::string::npos) << job.status();
  // An override's error names it (it said "(in the submitted config)").
  auto typed = cluster.client->Submit(files->dump(), {"train.train_iter=abc"});
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(typed.status().message().find("(from override 'train.train_iter=abc')"), std::string::npos)
      << typed.status();
  auto bad = cluster.client->Submit("{\"model\": 3", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

// A worker checks a node plan as it loads it, before binding anything to
// it: one of negative iterations (or past 2^62 in all) was loaded, run as
// nothing and reported a success.
TEST(ClusterEngineErrors, ANodePlanIsCheckedAsItLoads) {
  auto files = config::LoadConfigFiles(SourcePath("configs/gpt2_nano.json"));
  ASSERT_TRUE(files.ok()) << files.status();
  const std::unique_ptr<JobCompiler> compiler = MakeEngineJobCompiler();
  auto spec = compiler->Resolve(files->dump(), {"train.train_iter=2", "model.num_layers=1"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto parts = compiler->Compile(*spec, {WorkerSlot{"w", 0, static_cast<int>(spec->devices_needed), ""}});
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 1u);
  RunContext context;
  context.node = 0;
  {
    std::unique_ptr<PlanRunner> runner = MakeEnginePlanRunnerFactory()();
    EXPECT_TRUE(runner->Load(context, parts->at(0)).ok());
  }
  const auto load_with = [&](int64_t start, int64_t iterations) {
    auto node_plan = actors::ParseNodePlan(parts->at(0));
    EXPECT_TRUE(node_plan.ok()) << node_plan.status();
    node_plan->mutable_plan()->set_start_iteration(start);
    node_plan->mutable_plan()->set_iterations(iterations);
    return MakeEnginePlanRunnerFactory()()->Load(context, actors::SerializeNodePlan(*node_plan));
  };
  const absl::Status negative = load_with(0, -1);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument) << negative;
  EXPECT_NE(negative.message().find("plan has negative iterations"), std::string::npos) << negative;
  const absl::Status past = load_with(int64_t{1} << 62, int64_t{1} << 62);
  EXPECT_NE(past.message().find("at most 2^62 in all"), std::string::npos) << past;
}

// A job's checkpoint continues on the cluster: 8 iterations straight vs 4,
// then a resumed job of 8 (train.resume, what `tessera submit --resume`
// sets), under a layout spanning both workers: the same metrics.jsonl
// losses, bit for bit, and the resumed job's metrics.jsonl holds the first
// job's rows up to the checkpoint, then its own.
TEST(ClusterEngineCheckpoints, ResumedJobContinuesTheStraightRunsLosses) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_cluster_resume_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EngineCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto files = config::LoadConfigFiles(SourcePath("configs/gpt2_nano.json"));
  ASSERT_TRUE(files.ok()) << files.status();
  const auto run = [&](const std::filesystem::path& out, int iterations, bool resume) {
    // A constant learning rate: the job of 4 iterations trains them with the
    // rates of the job of 8.
    std::vector<std::string> overrides =
        Overrides(out, {"train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2",
                        "train.checkpointer.period=4", "lr_scheduler._target_=ConstantLR", "train.warmup_ratio=0"});
    overrides.push_back("train.train_iter=" + std::to_string(iterations));
    if (resume) overrides.push_back("train.resume=true");
    ASSERT_NO_FATAL_FAILURE(cluster.RunJob(files->dump(), overrides));
  };
  ASSERT_NO_FATAL_FAILURE(run(dir / "straight", 8, false));
  const std::vector<double> straight = LossesOf(dir / "straight" / "metrics.jsonl");
  ASSERT_EQ(straight.size(), 8u);
  ASSERT_NO_FATAL_FAILURE(run(dir / "resumed", 4, false));
  ASSERT_TRUE(std::filesystem::exists(dir / "resumed" / "checkpoints" / "iter_0000004" / "index.json"));
  ASSERT_NO_FATAL_FAILURE(run(dir / "resumed", 8, true));
  const std::vector<double> resumed = LossesOf(dir / "resumed" / "metrics.jsonl");
  ASSERT_EQ(resumed.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(resumed[i], straight[i]) << "iteration " << i + 1;
  ASSERT_TRUE(std::filesystem::exists(dir / "resumed" / "checkpoints" / "iter_0000008" / "index.json"));
  // Resumed with another seed: it runs, and the job's log says so (the
  // warning went only to the master's stderr, once per master).
  std::vector<std::string> reseeded = Overrides(
      dir / "resumed", {"train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2",
                        "train.checkpointer.period=4", "lr_scheduler._target_=ConstantLR", "train.warmup_ratio=0"});
  for (const char* o : {"train.train_iter=9", "train.resume=true", "train.seed=77"}) reseeded.push_back(o);
  ASSERT_NO_FATAL_FAILURE(cluster.RunJob(files->dump(), reseeded));
  std::ifstream log(dir / "resumed" / "log.txt");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("[master] warning: train.resume: train.seed 1234 -> 77"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

// A resumed job whose earlier run logged two million rows: its outputs open
// (metrics.jsonl read and rewritten up to the checkpoint) while the master
// answers everyone else. They opened under the master's lock, and every
// call (a `tessera status`, the workers' heartbeats) waited seconds.
TEST(ClusterEngineCheckpoints, AResumedJobsLongMetricsFileHoldsNoOtherCall) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_cluster_long_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EngineCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto files = config::LoadConfigFiles(SourcePath("configs/gpt2_nano.json"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::vector<std::string> overrides = Overrides(dir, {"train.checkpointer.period=2"});
  overrides.push_back("train.train_iter=2");
  ASSERT_NO_FATAL_FAILURE(cluster.RunJob(files->dump(), overrides));
  constexpr int kRows = 2000000;
  {
    // Rows of the earlier run up to the checkpoint (kept), and past it
    // (dropped).
    std::ofstream metrics(dir / "metrics.jsonl", std::ios::app);
    for (int i = 0; i < kRows; ++i) metrics << "{\"iter\":" << (i % 2 == 0 ? 1 : 3) << ",\"note\":1.5}\n";
  }
  overrides.back() = "train.train_iter=4";
  overrides.push_back("train.resume=true");
  auto job = cluster.client->Submit(files->dump(), overrides);
  ASSERT_TRUE(job.ok()) << job.status();
  control::JobInfo info;
  absl::Duration slowest;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        const absl::Time asked = absl::Now();
        auto got = cluster.client->Get(*job);
        slowest = std::max(slowest, absl::Now() - asked);
        if (got.ok()) info = *got;
        return got.ok() && (info.state() == control::SUCCEEDED || info.state() == control::FAILED ||
                            info.state() == control::CANCELLED);
      },
      absl::Seconds(120)));
  ASSERT_EQ(info.state(), control::SUCCEEDED) << info.DebugString();
  EXPECT_LT(slowest, absl::Milliseconds(700)) << "a call waited for the outputs to open";
  std::ifstream in(dir / "metrics.jsonl");
  int losses = 0, kept = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains("note")) {
      ++kept;
      EXPECT_EQ(row.at("iter"), 1);
    } else if (row.contains("loss")) {
      ++losses;
    }
  }
  EXPECT_EQ(kept, kRows / 2);
  EXPECT_EQ(losses, 4);
  std::filesystem::remove_all(dir);
}

// A graceful cancel of a job spanning both workers (a pipeline whose stages
// sit on different workers, with data parallelism and accumulation): the
// nodes agree on an iteration boundary, each finishes the iterations before
// it, the checkpoint there is committed, and the job ends CANCELLED saying
// where; resuming from it continues with the losses of a run that was never
// stopped.
TEST(ClusterEngineCheckpoints, GracefulCancelOfAJobSpanningWorkersCheckpointsWhereTheNodesAgree) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_cluster_cancel_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EngineCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto files = config::LoadConfigFiles(SourcePath("configs/gpt2_nano.json"));
  ASSERT_TRUE(files.ok()) << files.status();
  // One segment, or a segment (and a checkpoint) every 2 iterations: the
  // stop finds nodes inside a segment or between two.
  for (const std::string period : {"null", "2"}) {
  SCOPED_TRACE("train.checkpointer.period=" + period);
  const auto overrides = [&](const std::filesystem::path& out, int64_t iterations, bool resume) {
    std::vector<std::string> o = Overrides(
        out, {"train.dist.pipeline_parallel_size=2", "train.dist.data_parallel_size=2",
              "train.num_accumulation_steps=2", "train.checkpointer.period=" + period, "lr_scheduler._target_=ConstantLR",
              "train.warmup_ratio=0"});
    o.push_back("train.train_iter=" + std::to_string(iterations));
    if (resume) o.push_back("train.resume=true");
    return o;
  };
  const std::filesystem::path cancelled = dir / ("cancelled_" + period);
  auto job = cluster.client->Submit(files->dump(), overrides(cancelled, 100000, false));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        auto info = cluster.client->Get(*job);
        return info.ok() && info->iteration() >= 3;
      },
      absl::Seconds(60)));
  auto answer = cluster.client->Cancel(*job, "enough", /*checkpoint=*/true);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->state(), control::RUNNING) << "a graceful cancel answers at once";
  control::JobInfo info;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        auto got = cluster.client->Get(*job);
        if (got.ok()) info = *got;
        return got.ok() && (info.state() == control::SUCCEEDED || info.state() == control::FAILED ||
                            info.state() == control::CANCELLED);
      },
      absl::Seconds(60)));
  ASSERT_EQ(info.state(), control::CANCELLED) << info.DebugString();
  const std::string& reason = info.reason();
  EXPECT_NE(reason.find("cancelled: enough"), std::string::npos) << reason;
  const size_t at = reason.find("interrupted at iteration ");
  ASSERT_NE(at, std::string::npos) << reason;
  const int64_t stopped = std::stoll(reason.substr(at + std::string("interrupted at iteration ").size()));
  EXPECT_GE(stopped, 3);
  EXPECT_LT(stopped, 100000);
  EXPECT_EQ(info.iteration(), stopped) << "the job's progress is where it stopped";
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(stopped));
  ASSERT_TRUE(std::filesystem::exists(cancelled / "checkpoints" / name / "index.json")) << reason;
  EXPECT_NE(reason.find(name), std::string::npos) << reason;
  EXPECT_EQ(LossesOf(cancelled / "metrics.jsonl").size(), static_cast<size_t>(stopped));

  // Resumed to two past where it stopped: the losses of a straight run.
  ASSERT_NO_FATAL_FAILURE(cluster.RunJob(files->dump(), overrides(cancelled, stopped + 2, true)));
  ASSERT_NO_FATAL_FAILURE(cluster.RunJob(files->dump(), overrides(dir / ("straight_" + period), stopped + 2, false)));
  const std::vector<double> resumed = LossesOf(cancelled / "metrics.jsonl");
  const std::vector<double> straight = LossesOf(dir / ("straight_" + period) / "metrics.jsonl");
  ASSERT_EQ(straight.size(), static_cast<size_t>(stopped + 2));
  ASSERT_EQ(resumed.size(), straight.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "iteration " << i + 1;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::cluster
