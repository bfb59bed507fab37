// Failures with the engine behind the daemons: a master in this process (the
// engine's compiler, an operator's default liveness settings) and workers
// that are `tessera worker` processes running gpt2_nano over gloo.
// - a SIGKILLed worker fails its job within 10 s, the reason naming it; the
//   other worker stays up and runs the next job;
// - a SIGSTOPped worker (a hung node): the same within 15 s;
// - a cancel stops every actor on every worker within 5 s (the workers are
//   free and back to their idle thread count), and the next job runs;
// - SIGINT to a worker mid-job: a checkpoint where the nodes agree, the job
//   CANCELLED naming the worker, which then exits 0; with its master hung,
//   it still checkpoints its job and exits within seconds;
// - SIGINT to the master mid-job: a checkpoint, the job CANCELLED saying so;
//   a second one exits at once even while a worker hangs;
// - 20 jobs in a row on the same workers: thread count and RSS stay flat.

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/engine_job.h"
#include "core/config.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/child_process.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/deadline.h"
#include "tests/train/sentence_corpus.h"

namespace tessera::cluster {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using tessera::testing::ChildProcess;
using tessera::testing::Deadline;
using testing::WaitUntil;

// A value of /proc/PID/status ("Threads", "VmRSS" in kB); -1 if absent.
int64_t ProcStatus(pid_t pid, const std::string& key) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(key + ":")) return std::stoll(line.substr(key.size() + 1));
  }
  return -1;
}

class ClusterFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("tessera_failure_", getpid(), "_",
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Master::Options options;
    options.stop_grace = absl::Seconds(4);  // a graceful cancel that hangs gives up soon
    master_ = std::make_unique<Master>(options, MakeEngineJobCompiler());
    auto bound = master_->Start();
    ASSERT_TRUE(bound.ok()) << bound.status();
    address_ = *bound;
    Client::Options client;
    client.master = address_;
    client_ = std::make_unique<Client>(client);
    auto files = config::LoadConfigFiles(std::string(TESSERA_SOURCE_DIR) + "/configs/gpt2_nano.json");
    ASSERT_TRUE(files.ok()) << files.status();
    config_ = files->dump();
  }
  void TearDown() override {
    workers_.clear();
    master_->Shutdown();
    fs::remove_all(dir_);
  }

  ChildProcess& StartWorker(const std::string& id, const std::string& devices = "cpu:2") {
    workers_.push_back(std::make_unique<ChildProcess>(
        TESSERA_BINARY, std::vector<std::string>{"worker", "--master", address_, "--devices", devices, "--id", id},
        dir_ / (id + ".out")));
    return *workers_.back();
  }

  // Waits until `n` workers are registered and free.
  bool WaitFreeWorkers(size_t n, absl::Duration limit = absl::Seconds(20)) {
    return WaitUntil(
        [&] {
          auto workers = client_->ListWorkers();
          if (!workers.ok() || workers->size() != n) return false;
          for (const auto& w : *workers) {
            if (!w.job_id().empty()) return false;
          }
          return true;
        },
        limit);
  }

  // gpt2_nano (2 layers) on `layout`, `iterations` long, one log line each,
  // into an output directory of its own.
  absl::StatusOr<std::string> Submit(std::vector<std::string> layout, int64_t iterations) {
    if (std::none_of(layout.begin(), layout.end(),
                     [](const std::string& o) { return o.starts_with("train.output_dir="); })) {
      layout.push_back(absl::StrCat("train.output_dir=", (dir_ / absl::StrCat("out", ++submitted_)).string()));
    }
    layout.insert(layout.end(), {"model.num_layers=2", absl::StrCat("train.train_iter=", iterations),
                                 "train.log_period=1", "train.dist.intra_op_threads=1"});
    return client_->Submit(config_, layout);
  }
  absl::StatusOr<std::string> SubmitLongDp4() { return Submit({"train.dist.data_parallel_size=4"}, 1000000); }

  // Waits until `job` has reported an iteration: it is mid-job on every worker.
  bool WaitIterating(const std::string& job) {
    return WaitUntil(
        [&] {
          auto info = client_->Get(job);
          return info.ok() && info->state() == control::RUNNING && info->iteration() >= 1;
        },
        absl::Seconds(60));
  }

  control::JobInfo WaitEnd(const std::string& job, absl::Duration limit) {
    return testing::WaitJobEnd(*client_, job, limit);
  }

  // A 2-device job (fits the one worker left) runs to completion.
  void ExpectNextJobSucceeds(const std::string& on_worker) {
    auto next = Submit({"train.dist.data_parallel_size=2"}, 3);
    ASSERT_TRUE(next.ok()) << next.status();
    const control::JobInfo info = WaitEnd(*next, absl::Seconds(60));
    EXPECT_EQ(info.state(), control::SUCCEEDED) << info.reason();
    ASSERT_EQ(info.slots_size(), 1);
    EXPECT_EQ(info.slots(0).worker_id(), on_worker);
    EXPECT_EQ(info.iteration(), 3);
  }

  fs::path dir_;
  int submitted_ = 0;
  std::unique_ptr<Master> master_;
  std::string address_;
  std::unique_ptr<Client> client_;
  std::string config_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
};

TEST_F(ClusterFailureTest, KilledWorkerFailsTheJobWithin10sNamingItAndTheNextJobRuns) {
  Deadline deadline(seconds(150), "a SIGKILLed worker under a gloo job");
  ChildProcess& survivor = StartWorker("w-a");
  ChildProcess& doomed = StartWorker("w-b");
  ASSERT_TRUE(WaitFreeWorkers(2));
  auto job = SubmitLongDp4();
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitIterating(*job));
  doomed.Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  const control::JobInfo info = WaitEnd(*job, absl::Seconds(10));
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  EXPECT_EQ(info.state(), control::FAILED);
  // The dead worker is the reason, not the survivor's lost gloo link.
  EXPECT_TRUE(info.reason().starts_with("worker w-b (node ") && info.reason().find(") lost: ") != std::string::npos)
      << info.reason();
  EXPECT_TRUE(survivor.Running()) << survivor.Output();
  ASSERT_TRUE(WaitFreeWorkers(1)) << "the survivor was not freed";
  ExpectNextJobSucceeds("w-a");
}

TEST_F(ClusterFailureTest, StoppedWorkerFailsTheJobWithin15sNamingIt) {
  Deadline deadline(seconds(150), "a SIGSTOPped worker under a gloo job");
  ChildProcess& survivor = StartWorker("w-a");
  ChildProcess& hung = StartWorker("w-c");
  ASSERT_TRUE(WaitFreeWorkers(2));
  auto job = SubmitLongDp4();
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitIterating(*job));
  hung.Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  const control::JobInfo info = WaitEnd(*job, absl::Seconds(15));
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(15));
  EXPECT_EQ(info.state(), control::FAILED);
  EXPECT_TRUE(info.reason().starts_with("worker w-c (node ") && info.reason().find(") lost: ") != std::string::npos)
      << info.reason();
  // The survivor was blocked in a collective with the hung node: it is
  // stopped, freed, and takes the next job.
  EXPECT_TRUE(survivor.Running()) << survivor.Output();
  ASSERT_TRUE(WaitFreeWorkers(1)) << "the survivor was not freed";
  ExpectNextJobSucceeds("w-a");
  hung.Signal(SIGCONT);
}

// `tessera cancel --now` before the first checkpoint: the directory the
// submission made goes, empty, once both nodes let the job go (it stayed,
// with an empty checkpoints/ at times: the master let go of it while the
// nodes' claims on checkpoints/ still held it).
TEST_F(ClusterFailureTest, ACancelAtOnceLeavesNoEmptyOutputDirectory) {
  Deadline deadline(seconds(150), "cancel --now and the output directory");
  StartWorker("w-a");
  StartWorker("w-b");
  ASSERT_TRUE(WaitFreeWorkers(2));
  for (int round = 0; round < 2; ++round) {
    const fs::path made = dir_ / absl::StrCat("made", round);
    // (Nothing logged: the directory holds no outputs of the job's.)
    auto job =
        client_->Submit(config_, {"train.dist.data_parallel_size=4", "train.output_dir=" + (made / "sub").string(),
                                  "model.num_layers=2", "train.train_iter=1000000", "train.log_period=1000000",
                                  "train.checkpointer.period=1000000", "train.dist.intra_op_threads=1"});
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(WaitIterating(*job));
    auto info = client_->Cancel(*job, "test", /*checkpoint=*/false);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->state(), control::CANCELLED);
    ASSERT_TRUE(WaitFreeWorkers(2, absl::Seconds(10)));
    EXPECT_TRUE(WaitUntil([&] { return !fs::exists(made); }, absl::Seconds(5))) << [&] {
      std::string left;
      for (const auto& entry : fs::recursive_directory_iterator(made)) left += entry.path().string() + " ";
      return left;
    }();
  }
}

TEST_F(ClusterFailureTest, CancelStopsEveryActorOnEveryWorkerWithin5s) {
  Deadline deadline(seconds(150), "cancelling a gloo job");
  std::vector<ChildProcess*> workers = {&StartWorker("w-a"), &StartWorker("w-b")};
  ASSERT_TRUE(WaitFreeWorkers(2));
  // The idle thread counts, after one job has made gRPC's pools what they stay.
  auto warm = Submit({"train.dist.data_parallel_size=4"}, 2);
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_EQ(WaitEnd(*warm, absl::Seconds(60)).state(), control::SUCCEEDED);
  ASSERT_TRUE(WaitFreeWorkers(2));
  std::vector<int64_t> idle_threads;
  for (ChildProcess* w : workers) idle_threads.push_back(ProcStatus(w->pid(), "Threads"));

  auto job = SubmitLongDp4();
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitIterating(*job));
  for (size_t i = 0; i < workers.size(); ++i) {
    EXPECT_GT(ProcStatus(workers[i]->pid(), "Threads"), idle_threads[i]) << "the job's actor threads are not running";
  }
  const absl::Time cancelled = absl::Now();
  auto info = client_->Cancel(*job, "test");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), control::CANCELLED);
  // A worker is free once its runtime has returned: every actor joined.
  ASSERT_TRUE(WaitFreeWorkers(2, absl::Seconds(5))) << "actors still running 5 s after the cancel";
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
  for (size_t i = 0; i < workers.size(); ++i) {
    // gRPC's pools may also drop a thread meanwhile.
    EXPECT_TRUE(WaitUntil([&] { return ProcStatus(workers[i]->pid(), "Threads") <= idle_threads[i]; },
                          absl::Seconds(2)))
        << "worker " << i << " has " << ProcStatus(workers[i]->pid(), "Threads") << " threads, " << idle_threads[i]
        << " when idle";
  }
  auto next = Submit({"train.dist.data_parallel_size=4"}, 2);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(WaitEnd(*next, absl::Seconds(60)).state(), control::SUCCEEDED);
}

// `tessera cancel JOB` (graceful by default) on a job spanning two worker
// processes: it waits for the job's end and prints it CANCELLED at the
// iteration the nodes agreed on, whose checkpoint both workers wrote.
TEST_F(ClusterFailureTest, CancelFromTheCliCheckpointsWhereTheNodesAgree) {
  Deadline deadline(seconds(120), "a graceful cancel from the CLI");
  StartWorker("w-a");
  StartWorker("w-b");
  ASSERT_TRUE(WaitFreeWorkers(2));
  const fs::path out = dir_ / "run";
  // A pipeline stage per worker: each writes its stage's shards.
  auto job = Submit({"train.dist.pipeline_parallel_size=2", "train.dist.data_parallel_size=2",
                     "train.output_dir=" + out.string()},
                    1000000);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitIterating(*job));
  const std::string cmd = absl::StrCat("timeout 60 ", TESSERA_BINARY, " cancel ", *job, " --master ", address_, " 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string printed;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) printed.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << printed;
  EXPECT_NE(printed.find("CANCELLED"), std::string::npos) << printed;
  const size_t at = printed.find("interrupted at iteration ");
  ASSERT_NE(at, std::string::npos) << printed;
  const int64_t stopped = std::stoll(printed.substr(at + std::string("interrupted at iteration ").size()));
  const control::JobInfo info = WaitEnd(*job, absl::Seconds(5));
  EXPECT_EQ(info.state(), control::CANCELLED);
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(stopped));
  const fs::path checkpoint = out / "checkpoints" / name;
  ASSERT_TRUE(fs::exists(checkpoint / "index.json")) << printed;
  int rank_files = 0;
  for (const auto& entry : fs::directory_iterator(checkpoint)) {
    rank_files += entry.path().filename().string().starts_with("rank_");
  }
  EXPECT_GE(rank_files, 2) << "a shard file from each worker";
  ASSERT_TRUE(WaitFreeWorkers(2, absl::Seconds(5)));
  // Cancelling it again: it is cancelled, as asked (exit 0, the job printed).
  FILE* again = popen(cmd.c_str(), "r");
  ASSERT_NE(again, nullptr);
  std::string reprinted;
  for (size_t n; (n = fread(buf, 1, sizeof buf, again)) > 0;) reprinted.append(buf, n);
  EXPECT_EQ(pclose(again), 0) << reprinted;
  EXPECT_NE(reprinted.find("CANCELLED"), std::string::npos) << reprinted;
}

// SIGINT to a `tessera worker` holding a job that spans two worker
// processes: the job stops where its nodes agree, with a checkpoint there
// written by both, and ends CANCELLED naming the worker; the worker exits 0
// once it has, and the other worker is free.
TEST_F(ClusterFailureTest, SigintToAWorkerCheckpointsItsJobBeforeItExits) {
  Deadline deadline(seconds(120), "a worker shut down mid-job");
  StartWorker("w-a");
  ChildProcess& leaving = StartWorker("w-b");
  ASSERT_TRUE(WaitFreeWorkers(2));
  const fs::path out = dir_ / "run";
  auto job = Submit(
      {"train.dist.pipeline_parallel_size=2", "train.dist.data_parallel_size=2", "train.output_dir=" + out.string()},
      1000000);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitIterating(*job));
  leaving.Signal(SIGINT);
  EXPECT_EQ(leaving.Wait(), 0) << leaving.Output();
  EXPECT_NE(leaving.Output().find("tessera worker: interrupted: stopping its jobs at an iteration boundary"),
            std::string::npos)
      << leaving.Output();
  const control::JobInfo info = WaitEnd(*job, absl::Seconds(5));
  EXPECT_EQ(info.state(), control::CANCELLED);
  const std::string said = "worker w-b is shutting down; interrupted at iteration ";
  ASSERT_TRUE(info.reason().starts_with(said)) << info.reason();
  const int64_t stopped = std::stoll(info.reason().substr(said.size()));
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(stopped));
  const fs::path checkpoint = out / "checkpoints" / name;
  ASSERT_TRUE(fs::exists(checkpoint / "index.json")) << info.reason();
  int rank_files = 0;
  for (const auto& entry : fs::directory_iterator(checkpoint)) {
    rank_files += entry.path().filename().string().starts_with("rank_");
  }
  EXPECT_GE(rank_files, 2) << "a shard file from each worker";
  // The worker staying is free; the one that left goes from the list once
  // its heartbeats stop.
  EXPECT_TRUE(WaitFreeWorkers(1, absl::Seconds(15)));
}

// A `tessera master` process and a `tessera worker` process (cpu:2) on it,
// running gpt2_nano data-parallel into `out` (one worker: every node is
// its).
struct ProcessCluster {
  ProcessCluster(fs::path dir, std::string config) : dir(std::move(dir)), config(std::move(config)) {}
  void StartAndSubmit() {
    ASSERT_NO_FATAL_FAILURE(StartMaster());
    worker = SpawnWorker("w-p", "cpu:2");
    ASSERT_TRUE(WaitWorkers(1));
    auto submitted = client->Submit(
        config, {"train.dist.data_parallel_size=2", "train.output_dir=" + out.string(), "model.num_layers=2",
                 "train.train_iter=1000000", "train.log_period=1", "train.dist.intra_op_threads=1"});
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    job = *submitted;
    ASSERT_TRUE(WaitIteration(job));
  }
  // A worker process of this master, `id` offering `devices`.
  std::unique_ptr<ChildProcess> SpawnWorker(const std::string& id, const std::string& devices) {
    return std::make_unique<ChildProcess>(
        TESSERA_BINARY, std::vector<std::string>{"worker", "--master", address, "--devices", devices, "--id", id},
        dir / absl::StrCat(id, ".out"));
  }
  // Whether `count` workers registered within 20 s.
  bool WaitWorkers(size_t count) {
    return WaitUntil(
        [&] {
          auto workers = client->ListWorkers();
          return workers.ok() && workers->size() == count;
        },
        absl::Seconds(20));
  }
  // Whether `job_id` ran an iteration within 60 s (as the master heard).
  bool WaitIteration(const std::string& job_id) {
    return WaitUntil(
        [&] {
          auto info = client->Get(job_id);
          return info.ok() && info->iteration() >= 1;
        },
        absl::Seconds(60));
  }
  // A master on the state directory (again, after one exited).
  void StartMaster() {
    master = std::make_unique<ChildProcess>(
        TESSERA_BINARY,
        [&] {
          std::vector<std::string> args{"master", "--listen", "127.0.0.1:0", "--state-dir", (dir / "state").string()};
          args.insert(args.end(), master_flags.begin(), master_flags.end());
          return args;
        }(),
        dir / absl::StrCat("master", ++masters, ".out"));  // a file of its own: the last one's says another port
    ASSERT_TRUE(WaitUntil(
        [&] {
          const std::string printed = master->Output();
          const size_t at = printed.find("master listening on ");
          if (at == std::string::npos || printed.find('\n', at) == std::string::npos) return false;
          address = printed.substr(at + 20, printed.find('\n', at) - at - 20);
          return true;
        },
        absl::Seconds(20)))
        << master->Output();
    Client::Options options;
    options.master = address;
    client = std::make_unique<Client>(options);
  }
  const fs::path dir;
  const std::string config;
  std::vector<std::string> master_flags;  // more flags of `tessera master`
  const fs::path out = dir / "run";
  std::unique_ptr<ChildProcess> master, worker;
  std::string address, job;
  std::unique_ptr<Client> client;
  int masters = 0;
};

// The newest complete checkpoint in `out`; empty if none.
fs::path NewestCheckpoint(const fs::path& out) {
  fs::path newest;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out / "checkpoints", ec)) {
    if (fs::exists(entry.path() / "index.json") && entry.path() > newest) newest = entry.path();
  }
  return newest;
}

// SIGINT to a `tessera master` process mid-job: the job stops at an
// iteration boundary with its checkpoint, ends CANCELLED saying so, and the
// master exits 0; the next master on its state directory lists it so.
// (Sent twice at once, as GNU timeout does: still one graceful stop; the
// second used to stop the jobs at once, without a checkpoint.)
TEST_F(ClusterFailureTest, SigintToTheMasterCheckpointsItsRunningJob) {
  Deadline deadline(seconds(120), "a master shut down mid-job");
  ProcessCluster cluster(dir_, config_);
  ASSERT_NO_FATAL_FAILURE(cluster.StartAndSubmit());
  cluster.master->Signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (taken before the second comes)
  cluster.master->Signal(SIGINT);
  EXPECT_EQ(cluster.master->Wait(), 0) << cluster.master->Output();
  EXPECT_EQ(cluster.master->Output().find("without a checkpoint"), std::string::npos) << cluster.master->Output();
  const fs::path checkpoint = NewestCheckpoint(cluster.out);
  ASSERT_FALSE(checkpoint.empty()) << cluster.master->Output();
  ASSERT_NO_FATAL_FAILURE(cluster.StartMaster());
  auto info = cluster.client->Get(cluster.job);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), control::CANCELLED);
  EXPECT_TRUE(info->reason().starts_with("the master is shutting down; interrupted at iteration ")) << info->reason();
  EXPECT_NE(info->reason().find(checkpoint.string()), std::string::npos) << info->reason();
}

// A master killed mid-job (SIGKILL: its record of the job's progress is
// seconds old) and started again fails the job saying how far it got, from
// metrics.jsonl, and what `--resume` would do: this job wrote no checkpoint.
// `tessera logs -f` of it says the master was lost.
TEST_F(ClusterFailureTest, AJobOfAKilledMasterFailsSayingHowFarItGot) {
  Deadline deadline(seconds(120), "a master killed mid-job");
  ProcessCluster cluster(dir_, config_);
  ASSERT_NO_FATAL_FAILURE(cluster.StartAndSubmit());
  const auto logged = [&] {
    int64_t last = 0;
    std::ifstream in(cluster.out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
      if (row.is_object() && row.contains("iter")) last = std::max(last, row["iter"].get<int64_t>());
    }
    return last;
  };
  ASSERT_TRUE(WaitUntil([&] { return logged() >= 5; }, absl::Seconds(60)));
  // Ctrl-C stops following, saying the job runs on (it ended silently).
  ChildProcess interrupted(TESSERA_BINARY, {"logs", "--master", cluster.address, cluster.job, "-f"},
                           dir_ / "interrupted.out");
  std::this_thread::sleep_for(std::chrono::seconds(1));  // it is watching
  interrupted.Signal(SIGINT);
  EXPECT_EQ(interrupted.Wait(), 130) << interrupted.Output();
  EXPECT_NE(interrupted.Output().find("tessera: stopped following job " + cluster.job +
                                      "; it runs on (`tessera cancel " + cluster.job + "` stops it)"),
            std::string::npos)
      << interrupted.Output();
  auto still = cluster.client->Get(cluster.job);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), control::RUNNING);
  // A follower of its logs is told the master was lost.
  ChildProcess follower(TESSERA_BINARY, {"logs", "--master", cluster.address, cluster.job, "-f"},
                        dir_ / "follower.out");
  std::this_thread::sleep_for(std::chrono::seconds(1));  // it is watching
  cluster.master->Signal(SIGKILL);
  cluster.master->Wait();
  EXPECT_EQ(follower.Wait(), 1);
  EXPECT_NE(
      follower.Output().find("tessera: lost the master at " + cluster.address + " while following job " + cluster.job),
      std::string::npos)
      << follower.Output();
  const int64_t reached = logged();
  // The worker trains on until it notices the master is gone (and may
  // checkpoint meanwhile): the reason says so while a node holds the
  // checkpoints. (Held here too, so the message does not depend on when
  // the worker notices.)
  auto writer = DirectoryClaim::AcquireShared(cluster.out / "checkpoints");
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_NO_FATAL_FAILURE(cluster.StartMaster());
  auto info = cluster.client->Get(cluster.job);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), control::FAILED);
  EXPECT_GE(info->iteration(), reached);
  EXPECT_EQ(info->reason(), absl::StrCat("master restarted (the job had reached iteration ", info->iteration(),
                                         "; a node of it is still writing its checkpoints (none so far): once it "
                                         "has stopped, `tessera submit --resume` continues from the latest)"));
  writer->Release();
  EXPECT_TRUE(NewestCheckpoint(cluster.out).empty());
}

// Rewrites field `key` of `job`'s record in the state directory (what a
// master killed before it recorded the job's end leaves).
void EditRecord(const fs::path& state, const std::string& job, const std::string& key, const nlohmann::json& value) {
  const fs::path path = state / (job + ".json");
  std::ifstream in(path);
  nlohmann::json record = nlohmann::json::parse(in);
  in.close();
  record[key] = value;
  std::ofstream(path) << record.dump(2);
}

// A job that finished while its master was down (its record still says
// RUNNING, its checkpoint of the last iteration complete, the rows of its
// last iterations never reached metrics.jsonl) is listed SUCCEEDED by the
// next master, not FAILED with advice to `--resume` a run that is over.
// (The daemons are stopped by SIGHUP, gracefully: it killed them at once.)
TEST_F(ClusterFailureTest, AJobThatFinishedWhileTheMasterWasDownSucceeded) {
  Deadline deadline(seconds(120), "a job that finished while the master was down");
  ProcessCluster cluster(dir_, config_);
  ASSERT_NO_FATAL_FAILURE(cluster.StartMaster());
  cluster.worker = std::make_unique<ChildProcess>(
      TESSERA_BINARY, std::vector<std::string>{"worker", "--master", cluster.address, "--devices", "cpu:1"},
      dir_ / "w.out");
  auto submitted = cluster.client->Submit(config_, {"train.output_dir=" + cluster.out.string(), "model.num_layers=1",
                                                    "train.train_iter=6", "train.log_period=1"});
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto info = cluster.client->Get(*submitted);
        return info.ok() && info->state() == control::SUCCEEDED;
      },
      absl::Seconds(60)));
  // A hangup (its terminal closed) stops a daemon as SIGTERM does: exit 0.
  cluster.master->Signal(SIGHUP);
  ASSERT_EQ(cluster.master->Wait(), 0) << cluster.master->Output();
  ASSERT_EQ(NewestCheckpoint(cluster.out).filename(), "iter_0000006");
  EditRecord(dir_ / "state", *submitted, "state", "RUNNING");
  EditRecord(dir_ / "state", *submitted, "reason", "");
  // Its record was persisted at iteration 2 (the values of then); the
  // restarted master shows the last logged row's beside its iteration.
  EditRecord(dir_ / "state", *submitted, "iteration", 2);
  EditRecord(dir_ / "state", *submitted, "last_metrics", nlohmann::json{{"loss", 99.0}});
  double fourth_loss = 0;
  {  // The master saw iterations 1-4 only.
    std::ifstream in(cluster.out / "metrics.jsonl");
    std::string rows, line;
    for (int i = 0; i < 4 && std::getline(in, line); ++i) {
      rows += line + "\n";
      fourth_loss = nlohmann::json::parse(line).at("loss").get<double>();
    }
    in.close();
    std::ofstream(cluster.out / "metrics.jsonl") << rows;
  }
  ASSERT_NO_FATAL_FAILURE(cluster.StartMaster());
  auto info = cluster.client->Get(*submitted);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), control::SUCCEEDED) << info->reason();
  EXPECT_EQ(info->reason(),
            "it finished while the master was down (its checkpoint of the last iteration, 6, is complete; "
            "metrics.jsonl ends at iteration 4)");
  EXPECT_EQ(info->iteration(), 6);
  ASSERT_TRUE(info->last_metrics().contains("loss"));
  EXPECT_EQ(info->last_metrics().at("loss"), fourth_loss);
  // The job as the next master lists it when its record says `state`.
  const auto restarted_as = [&](const char* state) {
    cluster.master->Signal(SIGHUP);
    EXPECT_EQ(cluster.master->Wait(), 0) << cluster.master->Output();
    EditRecord(dir_ / "state", *submitted, "state", state);
    cluster.StartMaster();
    auto restarted = cluster.client->Get(*submitted);
    EXPECT_TRUE(restarted.ok()) << restarted.status();
    return restarted.ok() ? *restarted : control::JobInfo();
  };
  // Its final evaluation cut short by the stop (the checkpoint says so):
  // not SUCCEEDED (it was), since `--resume` has that evaluation to run.
  const fs::path index_path = NewestCheckpoint(cluster.out) / "index.json";
  nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
  index["train_state"]["evaluation_pending"] = true;
  std::ofstream(index_path) << index.dump(2);
  control::JobInfo pending = restarted_as("RUNNING");
  EXPECT_EQ(pending.state(), control::FAILED) << pending.reason();
  EXPECT_EQ(pending.reason(),
            "master restarted (the job had trained its last iteration, 6, but a stop cut its final evaluation short: "
            "`tessera submit --resume` runs it)");
  // A job that was still being placed ran nothing, whatever its output
  // directory holds (here: an earlier run's last checkpoint, which made it
  // SUCCEEDED).
  control::JobInfo placing = restarted_as("COMPILING");
  EXPECT_EQ(placing.state(), control::FAILED) << placing.reason();
  EXPECT_EQ(placing.reason(),
            "master restarted while the job was starting (COMPILING: no iteration had run): submit it again");
  cluster.worker->Signal(SIGHUP);
  EXPECT_EQ(cluster.worker->Wait(), 0) << cluster.worker->Output();
}

// A job the master had begun to compile when it was killed, into an
// output directory its submission made: the next master fails it and
// removes that directory, empty, as at any job's end (it stayed, and the
// record forgot it had been made).
TEST_F(ClusterFailureTest, AJobCompilingWhenTheMasterDiedLeavesNoEmptyOutputDirectory) {
  Deadline deadline(seconds(120), "a job compiling when its master died");
  ProcessCluster cluster(dir_, config_);
  ASSERT_NO_FATAL_FAILURE(cluster.StartMaster());
  const fs::path out = dir_ / "made_by_submit";
  auto submitted = cluster.client->Submit(config_, {"train.output_dir=" + out.string()});  // no worker: PENDING
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_TRUE(fs::is_directory(out));
  cluster.master->Signal(SIGKILL);
  cluster.master->Wait();
  EditRecord(dir_ / "state", *submitted, "state", "COMPILING");
  ASSERT_NO_FATAL_FAILURE(cluster.StartMaster());
  auto info = cluster.client->Get(*submitted);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), control::FAILED);
  EXPECT_TRUE(info->reason().starts_with("master restarted")) << info->reason();
  EXPECT_FALSE(fs::exists(out));
}

// A second SIGINT to a master whose drain waits on a hung worker (SIGSTOP):
// it exits at once, not when its calls to that worker time out.
TEST_F(ClusterFailureTest, ASecondSigintToTheMasterExitsAtOnceWhateverItWaitsOn) {
  Deadline deadline(seconds(120), "a master stopped twice while a worker hangs");
  ProcessCluster cluster(dir_, config_);
  ASSERT_NO_FATAL_FAILURE(cluster.StartAndSubmit());
  cluster.worker->Signal(SIGSTOP);
  cluster.master->Signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // its Stop to the worker is in flight
  const absl::Time second = absl::Now();
  cluster.master->Signal(SIGINT);
  EXPECT_EQ(cluster.master->Wait(), 0) << cluster.master->Output();
  EXPECT_LT(absl::Now() - second, absl::Seconds(5)) << cluster.master->Output();
  cluster.worker->Signal(SIGCONT);
}

// SIGINT to a worker while its master is hung (SIGSTOP: connected, never
// answering): the worker does not wait on the master. It stops its job
// (on it alone) at an iteration boundary with the checkpoint there, and
// exits 0 within seconds.
TEST_F(ClusterFailureTest, SigintToAWorkerWhoseMasterHangsStillCheckpoints) {
  Deadline deadline(seconds(120), "a worker shut down while its master hangs");
  ProcessCluster cluster(dir_, config_);
  ASSERT_NO_FATAL_FAILURE(cluster.StartAndSubmit());
  ChildProcess& master = *cluster.master;
  ChildProcess& worker = *cluster.worker;
  const fs::path out = cluster.out;
  master.Signal(SIGSTOP);
  const absl::Time signalled = absl::Now();
  worker.Signal(SIGINT);
  EXPECT_EQ(worker.Wait(), 0) << worker.Output();
  // 5-8 s: a 2 s heartbeat unanswered, the iteration, the checkpoint, a 2 s try of the final report,
  // the heartbeat thread's last call.
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(15)) << worker.Output();  // (loaded CI machines: more)
  master.Signal(SIGCONT);
  EXPECT_FALSE(NewestCheckpoint(out).empty()) << worker.Output();
}

// SIGTERM to a worker of a job that spans two workers while their master
// is hung: the nodes agree where to stop through the master's KV, which
// does not answer, so the worker stops its part at once and exits within
// the 10 s docs/cluster.md promises (it waited on the KV call's 10 s
// deadline first: 15-18 s).
TEST_F(ClusterFailureTest, AWorkerOfAJobSpanningWorkersExitsPromptlyWhenItsMasterHangs) {
  Deadline deadline(seconds(120), "a worker of a two-worker job shut down while its master hangs");
  ProcessCluster cluster(dir_, config_);
  ASSERT_NO_FATAL_FAILURE(cluster.StartMaster());
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (const char* id : {"w-s", "w-t"}) workers.push_back(cluster.SpawnWorker(id, "cpu:1"));
  ASSERT_TRUE(cluster.WaitWorkers(2));
  auto job = cluster.client->Submit(
      config_, {"train.dist.data_parallel_size=2", "train.output_dir=" + cluster.out.string(), "model.num_layers=2",
                "train.train_iter=1000000", "train.log_period=1", "train.dist.intra_op_threads=1"});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster.WaitIteration(*job));
  cluster.master->Signal(SIGSTOP);
  const absl::Time signalled = absl::Now();
  workers[0]->Signal(SIGTERM);
  workers[0]->Wait();
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(10)) << workers[0]->Output();
  // (Said by the drain, or by the heartbeats where they noticed first.)
  const std::string said = workers[0]->Output();
  EXPECT_TRUE(said.find("the master did not hear that this worker is shutting down") != std::string::npos ||
              said.find("lost the master") != std::string::npos)
      << said;
  cluster.master->Signal(SIGCONT);
}

// A job whose worker trained its last iteration and committed the final
// checkpoint, then died before its end reached the hung master: the
// master, finding the worker lost, finds the job complete and ends it
// SUCCEEDED (it was FAILED "worker lost", as if cut short). (The master
// waits 30 s for a silent worker, and so the worker for it: the job
// trains on while the master is stopped.)
TEST_F(ClusterFailureTest, AJobWhoseWorkerDiedAfterItsEndSucceeds) {
  Deadline deadline(seconds(150), "a job whose end report was lost with its worker");
  ProcessCluster cluster(dir_, config_);
  cluster.master_flags = {"--worker-timeout-ms", "30000"};
  ASSERT_NO_FATAL_FAILURE(cluster.StartMaster());
  auto worker = cluster.SpawnWorker("w-u", "cpu:2");
  ASSERT_TRUE(cluster.WaitWorkers(1));
  // (No row or line reaches the master before the final checkpoint; its
  // progress comes with the heartbeats.)
  auto job =
      cluster.client->Submit(config_, {"train.dist.data_parallel_size=2", "train.output_dir=" + cluster.out.string(),
                                       "model.num_layers=1", "train.train_iter=1000", "train.log_period=100000",
                                       "train.checkpointer.period=null", "train.dist.intra_op_threads=1"});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster.WaitIteration(*job));
  cluster.master->Signal(SIGSTOP);
  const fs::path final_checkpoint = cluster.out / "checkpoints" / "iter_0001000" / "index.json";
  ASSERT_TRUE(WaitUntil([&] { return fs::exists(final_checkpoint); }, absl::Seconds(60))) << worker->Output();
  worker->Signal(SIGKILL);
  worker->Wait();
  cluster.master->Signal(SIGCONT);
  control::JobInfo info;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto got = cluster.client->Get(*job);
        if (got.ok()) info = *got;
        return got.ok() && (info.state() == control::SUCCEEDED || info.state() == control::FAILED);
      },
      absl::Seconds(60)));
  EXPECT_EQ(info.state(), control::SUCCEEDED) << info.reason();
  std::string lines;
  EXPECT_TRUE(cluster.client
                  ->Watch(
                      *job,
                      [&](const control::JobEvent& event) {
                        if (event.has_log_line()) lines += event.log_line() + "\n";
                        return true;
                      },
                      /*follow=*/false)
                  .ok());
  EXPECT_NE(lines.find(" after the job's end: its checkpoint of the last iteration, 1000, is complete"),
            std::string::npos)
      << lines;
}

// `tessera submit --fast-dev-run` resolves the config where it runs and
// sends the master a 20-iteration job whose outputs go under
// train.output_dir/fast_dev_run; with --resume it is refused before
// anything is sent.
TEST_F(ClusterFailureTest, FastDevRunFromTheCliWritesUnderItsSubdirectory) {
  Deadline deadline(seconds(120), "a fast dev run submitted from the CLI");
  StartWorker("w-a");
  ASSERT_TRUE(WaitFreeWorkers(1));
  const fs::path out = dir_ / "run";
  const auto run = [&](const std::string& flags) {
    const std::string cmd =
        absl::StrCat("timeout 90 ", TESSERA_BINARY, " submit --master ", address_, " ", TESSERA_SOURCE_DIR,
                     "/configs/gpt2_nano.json model.num_layers=1 train.dist.data_parallel_size=2 "
                     "train.train_micro_batch_size=8 train.output_dir=",
                     out.string(), " ", flags, " 2>&1");
    FILE* pipe = popen(cmd.c_str(), "r");
    std::string printed;
    char buf[4096];
    for (size_t n; pipe != nullptr && (n = fread(buf, 1, sizeof buf, pipe)) > 0;) printed.append(buf, n);
    const int status = pipe == nullptr ? -1 : pclose(pipe);
    return std::make_pair(status, printed);
  };
  const auto [status, printed] = run("--fast-dev-run --follow");
  ASSERT_EQ(status, 0) << printed;
  EXPECT_NE(printed.find("SUCCEEDED"), std::string::npos) << printed;
  for (const char* name : {"iter_0000010", "iter_0000020"}) {
    EXPECT_TRUE(fs::exists(out / "fast_dev_run" / "checkpoints" / name / "index.json")) << name << "\n" << printed;
  }
  std::vector<std::string> entries;
  for (const auto& entry : fs::directory_iterator(out)) entries.push_back(entry.path().filename());
  EXPECT_EQ(entries, std::vector<std::string>{"fast_dev_run"});
  const auto [refused, line] = run("--fast-dev-run --resume");
  EXPECT_NE(refused, 0);
  EXPECT_EQ(line, "tessera: --fast-dev-run starts from scratch: it takes no --resume (train.resume)\n");
}

// train.checkpointer.save_best across worker processes: the evaluation's
// sink is on the second worker (the last pipeline stage), which decides and
// posts the decision; the first commits checkpoints/best from both workers'
// shards. eval_mode max keeps the first evaluation (the losses fall).
TEST_F(ClusterFailureTest, SaveBestAcrossWorkersKeepsTheBestEvaluation) {
  Deadline deadline(seconds(120), "save_best across workers");
  StartWorker("w-a");
  StartWorker("w-b");
  ASSERT_TRUE(WaitFreeWorkers(2));
  const fs::path corpus = dir_ / "corpus.txt", out = dir_ / "best_run";
  tessera::testing::WriteSentenceCorpus(corpus, 240, 12345);
  const auto shell = [](const std::string& cmd) {
    FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
    std::string printed;
    char buf[4096];
    for (size_t n; pipe != nullptr && (n = fread(buf, 1, sizeof buf, pipe)) > 0;) printed.append(buf, n);
    const int status = pipe == nullptr ? -1 : pclose(pipe);
    return std::make_pair(status, printed);
  };
  const fs::path vocab = dir_ / "warmup-vocab";
  const auto made = shell(absl::StrCat("timeout 60 ", TESSERA_BINARY, " preprocess --input ", corpus.string(),
                                       " --tokenizer bpe:320 --output ", (dir_ / "warmup").string()));
  ASSERT_EQ(made.first, 0) << made.second;
  const auto [status, printed] = shell(
      absl::StrCat("timeout 90 ", TESSERA_BINARY, " submit --master ", address_, " ", TESSERA_SOURCE_DIR,
                   "/configs/gpt2_nano.json model.vocab_size=320 model.num_layers=2 tokenization.tokenizer=gpt2 "
                   "tokenization.vocab_file=",
                   (vocab / "encoder.json").string(), " tokenization.merges_file=", (vocab / "vocab.bpe").string(),
                   " dataloader.data_prefix=", (dir_ / "data").string(), " dataloader.text_file=", corpus.string(),
                   " dataloader.splits=80,20,0 train.dist.pipeline_parallel_size=2 train.dist.data_parallel_size=2 "
                   "train.train_micro_batch_size=8 train.train_iter=3 train.evaluation.enabled=true "
                   "train.evaluation.eval_period=1 train.evaluation.eval_iter=1 train.checkpointer.save_best=true "
                   "train.evaluation.eval_mode=max train.output_dir=",
                   out.string(), " --follow"));
  ASSERT_EQ(status, 0) << printed;
  EXPECT_NE(printed.find("SUCCEEDED"), std::string::npos) << printed;
  EXPECT_NE(printed.find("saved best checkpoint"), std::string::npos) << printed;
  std::ifstream in(out / "checkpoints" / "best" / "index.json");
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(index.is_object()) << printed;
  EXPECT_EQ(index["iteration"], 1);
  std::ifstream metrics(out / "metrics.jsonl");
  double first_eval = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("eval_loss") && row["iter"] == 1) first_eval = row["eval_loss"].get<double>();
  }
  EXPECT_EQ(index["train_state"]["best"]["value"].get<double>(), first_eval);
}

// Graceful cancels at moments around an evaluation and a checkpoint (both
// every iteration), on a job whose pipeline stages are on two workers, the
// evaluation's sink on the second: each ends CANCELLED where the nodes
// agree, promptly, never "stopped at once" (the first worker, done with its
// part of an evaluation the stop cut short at the sink, waited for a
// save_best decision that never came; a worker that went on to load the
// next segment while the other stopped at its start waited for it until
// gloo's timeout failed the job). Resumed each time and then to the end,
// the run has one training row and one evaluation row per iteration: none
// lost (a cut-short evaluation the checkpoint did not mark) and none twice.
TEST_F(ClusterFailureTest, CancelsAroundEvaluationsAndCheckpointsStopPromptlyAndLoseNoEvaluation) {
  Deadline deadline(seconds(300), "cancels around evaluations");
  StartWorker("w-a", "cpu:1");
  StartWorker("w-b", "cpu:1");
  ASSERT_TRUE(WaitFreeWorkers(2));
  const fs::path corpus = dir_ / "corpus.txt", out = dir_ / "stops";
  tessera::testing::WriteSentenceCorpus(corpus, 240, 4321);
  const std::string made_cmd = absl::StrCat("timeout 60 ", TESSERA_BINARY, " preprocess --input ", corpus.string(),
                                            " --tokenizer bpe:320 --output ", (dir_ / "warmup").string(), " 2>&1");
  ASSERT_EQ(std::system(made_cmd.c_str()), 0);
  const fs::path vocab = dir_ / "warmup-vocab";
  const int64_t iterations = 40;
  // (A wide head: the sink's stage, on w-b, works on after w-a is done with
  // its part of an evaluation.)
  std::vector<std::string> job = {"model.vocab_size=32768",
                                  "tokenization.tokenizer=gpt2",
                                  "tokenization.vocab_file=" + (vocab / "encoder.json").string(),
                                  "tokenization.merges_file=" + (vocab / "vocab.bpe").string(),
                                  "dataloader.data_prefix=" + (dir_ / "data").string(),
                                  "dataloader.text_file=" + corpus.string(),
                                  "dataloader.splits=80,20,0",
                                  "train.dist.pipeline_parallel_size=2",  // a stage per worker
                                  "train.train_micro_batch_size=4",
                                  "train.evaluation.enabled=true",
                                  "train.evaluation.eval_period=1",
                                  "train.evaluation.eval_iter=6",  // the evaluation takes most of the time
                                  "train.checkpointer.period=1",
                                  "train.checkpointer.max_to_keep=1",
                                  "train.checkpointer.save_best=true",
                                  "train.output_dir=" + out.string()};
  int64_t reached = 0;
  int during_evaluation = 0;  // cancels that cut an evaluation short
  for (const int delay_ms : {0, 45, 120, 260, 20, 330, 80, 190}) {
    SCOPED_TRACE(absl::StrCat("cancel ", delay_ms, " ms after an iteration"));
    auto submitted = Submit(job, iterations);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    ASSERT_TRUE(WaitUntil(
        [&] {
          auto info = client_->Get(*submitted);
          return info.ok() && info->state() == control::RUNNING && info->iteration() > reached;
        },
        absl::Seconds(60)));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    const absl::Time asked = absl::Now();
    auto answer = client_->Cancel(*submitted, "test", /*checkpoint=*/true);
    ASSERT_TRUE(answer.ok()) << answer.status();
    const control::JobInfo info = WaitEnd(*submitted, absl::Seconds(60));
    EXPECT_EQ(info.state(), control::CANCELLED) << info.reason();
    EXPECT_NE(info.reason().find("interrupted at iteration"), std::string::npos) << info.reason();
    EXPECT_EQ(info.reason().find("at once"), std::string::npos) << info.reason();
    EXPECT_LT(absl::Now() - asked, absl::Seconds(20)) << info.reason();
    ASSERT_TRUE(WaitFreeWorkers(2, absl::Seconds(20)));
    reached = std::max(reached, info.iteration());
    if (job.back() != "train.resume=true") job.push_back("train.resume=true");
    for (const auto& entry : fs::directory_iterator(out / "checkpoints")) {
      const nlohmann::json index = nlohmann::json::parse(std::ifstream(entry.path() / "index.json"), nullptr, false);
      during_evaluation += index.is_object() && entry.path().filename().string().starts_with("iter_") &&
                           index["train_state"].value("evaluation_pending", false);
    }
  }
  std::printf("%d of the cancels cut an evaluation short\n", during_evaluation);
  ASSERT_LT(reached, iterations);
  auto last = Submit(job, iterations);
  ASSERT_TRUE(last.ok()) << last.status();
  const control::JobInfo finished = WaitEnd(*last, absl::Seconds(120));
  ASSERT_EQ(finished.state(), control::SUCCEEDED) << finished.reason();
  std::map<int64_t, int> train_rows, eval_rows;
  std::ifstream metrics(out / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(row.is_object()) << line;
    ++(row.contains("eval_loss") ? eval_rows : train_rows)[row.value("iter", int64_t{-1})];
  }
  for (int64_t i = 1; i <= iterations; ++i) {
    EXPECT_EQ(train_rows[i], 1) << "training rows of iteration " << i;
    EXPECT_EQ(eval_rows[i], 1) << "evaluation rows of iteration " << i;
  }
  EXPECT_EQ(train_rows.size(), static_cast<size_t>(iterations));
  EXPECT_EQ(eval_rows.size(), static_cast<size_t>(iterations));
}

// A graceful cancel while a node hangs (SIGSTOP: it never answers where it
// is): the job still ends CANCELLED once the master's grace period is over,
// the node that answered is not left blocked, and after the hung node comes
// back the next job runs.
TEST_F(ClusterFailureTest, GracefulCancelWithAHungNodeStopsAtOnceAfterTheGrace) {
  Deadline deadline(seconds(120), "a graceful cancel with a hung node");
  ChildProcess& a = StartWorker("w-a");
  ChildProcess& b = StartWorker("w-b");
  (void)a;
  ASSERT_TRUE(WaitFreeWorkers(2));
  auto job = SubmitLongDp4();
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitIterating(*job));
  ASSERT_EQ(::kill(b.pid(), SIGSTOP), 0);
  const absl::Time asked = absl::Now();
  auto answer = client_->Cancel(*job, "test", /*checkpoint=*/true);
  ASSERT_TRUE(answer.ok()) << answer.status();
  const control::JobInfo info = WaitEnd(*job, absl::Seconds(30));
  EXPECT_TRUE(info.state() == control::CANCELLED || info.state() == control::FAILED) << info.DebugString();
  EXPECT_LT(absl::Now() - asked, absl::Seconds(15));
  ASSERT_EQ(::kill(b.pid(), SIGCONT), 0);
  ASSERT_TRUE(WaitFreeWorkers(2, absl::Seconds(30)));
  auto next = Submit({"train.dist.data_parallel_size=4"}, 3);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(WaitEnd(*next, absl::Seconds(60)).state(), control::SUCCEEDED);
}

TEST_F(ClusterFailureTest, TwentyJobsLeaveThreadsAndMemoryFlat) {
  Deadline deadline(seconds(240), "20 gloo jobs");
  std::vector<ChildProcess*> workers = {&StartWorker("w-a"), &StartWorker("w-b")};
  ASSERT_TRUE(WaitFreeWorkers(2));
  constexpr int kJobs = 20;
  // Warm-up: allocator arenas and gRPC's pools settle. Which worker runs
  // which node changes from job to job and the nodes' memory differs, so the
  // baseline is the most either reached in the warm-up (glibc keeps freed
  // memory mapped: a high-water mark, not a leak); a leak of a few hundred
  // kB per job shows over the 10 jobs after it.
  constexpr int kWarmup = 10;
  std::vector<int64_t> threads_after_warmup(workers.size(), 0), rss_after_warmup(workers.size(), 0);
  for (int j = 0; j < kJobs; ++j) {
    // Alternate layouts, so each job builds different communicators.
    auto job = Submit(j % 2 == 0 ? std::vector<std::string>{"train.dist.data_parallel_size=4"}
                                 : std::vector<std::string>{"train.dist.data_parallel_size=2",
                                                            "train.dist.tensor_parallel_size=2"},
                      2);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(WaitEnd(*job, absl::Seconds(60)).state(), control::SUCCEEDED) << "job " << j;
    ASSERT_TRUE(WaitFreeWorkers(2));
    if (j < kWarmup) {
      for (size_t i = 0; i < workers.size(); ++i) {
        threads_after_warmup[i] = std::max(threads_after_warmup[i], ProcStatus(workers[i]->pid(), "Threads"));
        rss_after_warmup[i] = std::max(rss_after_warmup[i], ProcStatus(workers[i]->pid(), "VmRSS"));
      }
    }
  }
  const int64_t most_threads = *std::max_element(threads_after_warmup.begin(), threads_after_warmup.end());
  for (size_t i = 0; i < workers.size(); ++i) {
    // A leaked thread stays; one of gRPC's own that is still winding down
    // when the job is reported free goes within moments.
    WaitUntil([&] { return ProcStatus(workers[i]->pid(), "Threads") <= most_threads; }, absl::Seconds(2));
    const int64_t threads = ProcStatus(workers[i]->pid(), "Threads");
    // 10 more jobs may not add more than 5% (or 8 MiB) of memory (the worker
    // trims its heap once a job's threads are joined: wait for that).
    // The baseline is the most either worker reached (the comment above):
    // a worker that drew only the lighter node in the warm-up may draw the
    // heavier one later.
    const int64_t warm = *std::max_element(rss_after_warmup.begin(), rss_after_warmup.end());
    const int64_t limit = warm + std::max<int64_t>(warm / 20, 8 * 1024);
    WaitUntil([&] { return ProcStatus(workers[i]->pid(), "VmRSS") <= limit; }, absl::Seconds(2));
    const int64_t rss = ProcStatus(workers[i]->pid(), "VmRSS");
    EXPECT_LE(threads, most_threads) << "worker " << i;
    EXPECT_LE(rss, limit)
        << "worker " << i << " RSS " << rss << " kB after " << kJobs << " jobs, " << rss_after_warmup[i]
        << " kB after " << kWarmup;
    std::cout << "worker " << i << ": threads " << threads_after_warmup[i] << " -> " << threads << ", RSS "
              << rss_after_warmup[i] << " -> " << rss << " kB (jobs " << kWarmup << " -> " << kJobs << ")\n";
  }
}

}  // namespace
}  // namespace tessera::cluster
