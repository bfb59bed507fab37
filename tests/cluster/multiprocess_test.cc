// Workers in processes of their own (the verbs of apps/cluster_commands.cc
// over the test doubles): a SIGKILLed or SIGSTOPped worker fails its job
// within the promised time, with the master's default liveness settings;
// the CLI verbs end with one line and the right exit code; SIGTERM stops
// the daemons cleanly.

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/child_process.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/deadline.h"

namespace tessera::cluster::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using tessera::testing::Deadline;

// A child process running the test CLI.
class Process : public tessera::testing::ChildProcess {
 public:
  Process(const std::vector<std::string>& args, const fs::path& output)
      : ChildProcess(TESSERA_CLUSTER_TEST_CLI, args, output) {}
};

// Whether every thread of `pid` is stopped (state T in /proc).
bool AllThreadsStopped(pid_t pid) {
  std::error_code error;
  int threads = 0;
  for (const auto& task : fs::directory_iterator(fs::path("/proc") / std::to_string(pid) / "task", error)) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') return false;
    ++threads;
  }
  return !error && threads > 0;
}

class MultiprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("tessera_mp_", getpid(), "_",
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    // The defaults: what an operator gets.
    master_ = std::make_unique<Master>(Master::Options(), std::make_unique<FakeJobCompiler>());
    auto bound = master_->Start();
    ASSERT_TRUE(bound.ok()) << bound.status();
    address_ = *bound;
    Client::Options options;
    options.master = address_;
    client_ = std::make_unique<Client>(options);
  }
  void TearDown() override {
    workers_.clear();
    master_->Shutdown();
    fs::remove_all(dir_);
  }

  Process& StartWorker(const std::string& id) {
    workers_.push_back(std::make_unique<Process>(
        std::vector<std::string>{"worker", "--master", address_, "--devices", "cpu:1", "--id", id},
        dir_ / (id + ".out")));
    return *workers_.back();
  }

  bool WaitWorkers(size_t n) {
    return WaitUntil([&] {
      auto workers = client_->ListWorkers();
      return workers.ok() && workers->size() == n;
    });
  }

  std::unique_ptr<Process> RunCli(const std::vector<std::string>& args, const std::string& name) {
    auto process = std::make_unique<Process>(args, dir_ / (name + ".out"));
    return process;
  }

  // The CLI's master with `flags` on a port the OS picks, and the address
  // it printed (empty when it printed none in time).
  std::unique_ptr<Process> StartMasterProcess(std::vector<std::string> flags, const std::string& name,
                                              std::string* address) {
    flags.insert(flags.begin(), {"master", "--listen", "127.0.0.1:0"});
    auto master = RunCli(flags, name);
    const std::string listening = "master listening on ";
    address->clear();
    if (!WaitUntil([&] { return master->Output().find(listening) != std::string::npos; })) return master;
    const std::string output = master->Output();
    const size_t at = output.find(listening) + listening.size();
    *address = output.substr(at, output.find_first_of(" \n", at) - at);
    return master;
  }

  // A job placed on a worker that never answers its LoadPlan (w-h,
  // SIGSTOPped, the only worker): COMPILING.
  void SubmitOnAHungWorker(Process** hung, std::string* job) {
    *hung = &StartWorker("w-h");
    ASSERT_TRUE(WaitWorkers(1));
    (*hung)->Signal(SIGSTOP);
    // Stopped once every thread is (a thread stops when it next runs: one
    // took the LoadPlan meanwhile, and the job ran).
    ASSERT_TRUE(WaitUntil([&] { return AllThreadsStopped((*hung)->pid()); }));
    auto submitted = client_->Submit(R"({"iterations": 3})", {});
    ASSERT_TRUE(submitted.ok());
    *job = *submitted;
    ASSERT_TRUE(WaitUntil([&] { return client_->Get(*job)->state() == control::COMPILING; }));
  }

  control::JobInfo WaitEnd(const std::string& job, absl::Duration limit) {
    return testing::WaitJobEnd(*client_, job, limit);
  }

  fs::path dir_;
  std::unique_ptr<Master> master_;
  std::string address_;
  std::unique_ptr<Client> client_;
  std::vector<std::unique_ptr<Process>> workers_;
};

TEST_F(MultiprocessTest, KilledWorkerFailsTheJobWithin10sAndTheNextJobRuns) {
  Deadline deadline(seconds(40), "a SIGKILLed worker");
  StartWorker("w-a");
  Process& doomed = StartWorker("w-b");
  ASSERT_TRUE(WaitWorkers(2));
  auto job = client_->Submit(R"({"devices_needed": 2, "hang": true})", {});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WaitUntil([&] { return client_->Get(*job)->state() == control::RUNNING; }));
  doomed.Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  const control::JobInfo info = WaitEnd(*job, absl::Seconds(10));
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  EXPECT_EQ(info.state(), control::FAILED);
  EXPECT_TRUE(info.reason().starts_with("worker w-b (node ") && info.reason().find(") lost: ") != std::string::npos)
      << info.reason();
  auto next = client_->Submit(R"({"iterations": 3})", {});
  ASSERT_TRUE(next.ok());
  const control::JobInfo next_info = WaitEnd(*next, absl::Seconds(10));
  EXPECT_EQ(next_info.state(), control::SUCCEEDED) << next_info.reason();
  EXPECT_EQ(next_info.slots(0).worker_id(), "w-a");
}

// A worker lost while the job still loads (it never answered LoadPlan:
// SIGSTOPped) sends the job back to the queue, as an unreachable one does,
// and it runs on another worker (it was FAILED, nothing having run).
TEST_F(MultiprocessTest, AWorkerLostWhileTheJobLoadsRequeuesIt) {
  Deadline deadline(seconds(60), "a worker lost at LoadPlan");
  Process* hung = nullptr;
  std::string job;
  ASSERT_NO_FATAL_FAILURE(SubmitOnAHungWorker(&hung, &job));
  StartWorker("w-a");
  const control::JobInfo info = WaitEnd(job, absl::Seconds(40));
  EXPECT_EQ(info.state(), control::SUCCEEDED) << info.reason();
  ASSERT_EQ(info.slots_size(), 1);
  EXPECT_EQ(info.slots(0).worker_id(), "w-a");
  hung->Signal(SIGCONT);
}

// A launch waiting on a hung worker (its LoadPlan unanswered: SIGSTOP)
// holds no other job: one that fits a free worker runs meanwhile (it
// waited for that LoadPlan's 10 s).
TEST_F(MultiprocessTest, AHungLaunchHoldsNoOtherJob) {
  Deadline deadline(seconds(60), "a hung launch and another job");
  Process* hung = nullptr;
  std::string stuck;
  ASSERT_NO_FATAL_FAILURE(SubmitOnAHungWorker(&hung, &stuck));
  StartWorker("w-a");
  ASSERT_TRUE(WaitWorkers(2));
  const absl::Time submitted = absl::Now();
  auto other = client_->Submit(R"({"iterations": 3})", {});
  ASSERT_TRUE(other.ok());
  const control::JobInfo info = WaitEnd(*other, absl::Seconds(30));
  EXPECT_EQ(info.state(), control::SUCCEEDED) << info.reason();
  EXPECT_LT(absl::Now() - submitted, absl::Seconds(3)) << "it waited for the hung launch";
  EXPECT_EQ(client_->Get(stuck)->state(), control::COMPILING);
  hung->Signal(SIGCONT);
}

TEST_F(MultiprocessTest, StoppedWorkerFailsTheJobWithin15s) {
  Deadline deadline(seconds(40), "a SIGSTOPped worker");
  StartWorker("w-a");
  Process& hung = StartWorker("w-c");
  ASSERT_TRUE(WaitWorkers(2));
  auto job = client_->Submit(R"({"devices_needed": 2, "hang": true})", {});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WaitUntil([&] { return client_->Get(*job)->state() == control::RUNNING; }));
  hung.Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  // A cancel meanwhile cannot stop the hung node: the job ends FAILED, and
  // `tessera cancel` says so and exits 1.
  auto cancel = RunCli({"cancel", "--master", address_, *job}, "cancel-hung");
  const control::JobInfo info = WaitEnd(*job, absl::Seconds(15));
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(15));
  EXPECT_EQ(info.state(), control::FAILED);
  EXPECT_NE(info.reason().find("worker w-c"), std::string::npos) << info.reason();
  EXPECT_EQ(cancel->Wait(), 1) << cancel->Output();
  EXPECT_NE(cancel->Output().find("tessera: job " + *job + " FAILED: "), std::string::npos) << cancel->Output();
  // Cancelled again, ended: its line, and why it ended (it said only its state).
  auto again = RunCli({"cancel", "--master", address_, *job}, "cancel-ended");
  EXPECT_EQ(again->Wait(), 1) << again->Output();
  EXPECT_NE(again->Output().find(*job + " "), std::string::npos) << again->Output();
  EXPECT_NE(again->Output().find("tessera: job " + *job + " had already ended FAILED: worker w-c"), std::string::npos)
      << again->Output();
  // A job cancelled twice: the second says it had been (it printed the
  // line alone, as if it had stopped the job), exit 0.
  auto queued = client_->Submit(R"({"devices_needed": 9, "hang": true})", {});
  ASSERT_TRUE(queued.ok());
  auto first = RunCli({"cancel", "--master", address_, *queued}, "cancel-queued");
  EXPECT_EQ(first->Wait(), 0) << first->Output();
  EXPECT_EQ(first->Output().find("already"), std::string::npos) << first->Output();
  auto second = RunCli({"cancel", "--master", address_, *queued}, "cancel-queued-again");
  EXPECT_EQ(second->Wait(), 0) << second->Output();
  EXPECT_NE(second->Output().find("tessera: job " + *queued + " had already ended CANCELLED; nothing more to cancel"),
            std::string::npos)
      << second->Output();
  // The other worker was stopped and takes the next job.
  auto next = client_->Submit(R"({"iterations": 3})", {});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(WaitEnd(*next, absl::Seconds(10)).state(), control::SUCCEEDED);
  hung.Signal(SIGCONT);
}

TEST_F(MultiprocessTest, CliVerbsAndCleanStop) {
  Deadline deadline(seconds(40), "the CLI verbs");
  Process& worker = StartWorker("w-cli");
  ASSERT_TRUE(WaitWorkers(1));
  const fs::path config = dir_ / "job.json";
  std::ofstream(config) << "// a comment\n{\"iterations\": 5}\n";

  auto submit = RunCli({"submit", "--master", address_, config.string(), "iterations=4", "--follow"}, "submit");
  EXPECT_EQ(submit->Wait(), 0) << submit->Output();
  const std::string out = submit->Output();
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  EXPECT_NE(out.find("iter 4  loss 2.5"), std::string::npos) << out;
  const std::string job_id = out.substr(0, out.find('\n'));

  auto status = RunCli({"status", "--master", address_, job_id}, "status");
  EXPECT_EQ(status->Wait(), 0);
  EXPECT_NE(status->Output().find("SUCCEEDED"), std::string::npos) << status->Output();
  auto list = RunCli({"status", "--master", address_}, "list");
  EXPECT_EQ(list->Wait(), 0);
  EXPECT_NE(list->Output().find("worker w-cli"), std::string::npos) << list->Output();
  auto logs = RunCli({"logs", "--master", address_, job_id}, "logs");
  EXPECT_EQ(logs->Wait(), 0);
  EXPECT_NE(logs->Output().find("[node 0] node 0 done"), std::string::npos) << logs->Output();
  // And how the job ended, last.
  EXPECT_NE(logs->Output().find("] SUCCEEDED\n"), std::string::npos) << logs->Output();

  // Failures: one line, exit 1.
  for (const auto& [name, args] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"unknown", {"status", "--master", address_, "job-424242"}},
           {"cancel", {"cancel", "--master", address_, "job-424242"}},
           {"badconfig", {"submit", "--master", address_, (dir_ / "missing.json").string()}},
           {"nomaster", {"status", "--master", "127.0.0.1:1"}},
           {"noflag", {"worker", "--master", address_}},
           {"token", {"status", "--master", address_, "--token-file", (dir_ / "no-token").string()}}}) {
    auto failing = RunCli(args, name);
    EXPECT_EQ(failing->Wait(), 1) << name << ": " << failing->Output();
    const std::string text = failing->Output();
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << name << ": " << text;
  }
  auto help = RunCli({"submit", "--help"}, "help");
  EXPECT_EQ(help->Wait(), 0);
  EXPECT_NE(help->Output().find("--follow"), std::string::npos);

  // A job that fails: --follow exits 1 with the reason.
  std::ofstream(dir_ / "fail.json") << R"({"fail_node": 0, "fail_at": 1})";
  auto failed = RunCli({"submit", "--master", address_, (dir_ / "fail.json").string(), "--follow"}, "failed");
  EXPECT_EQ(failed->Wait(), 1);
  EXPECT_NE(failed->Output().find("FAILED: worker w-cli (node 0): INTERNAL: test runner: failing at iteration 1"),
            std::string::npos)
      << failed->Output();
  EXPECT_EQ(failed->Output().find("INTERNAL: test runner"), failed->Output().rfind("INTERNAL: test runner"))
      << failed->Output();
  // logs -f of it exits 1 too, after its lines; plain logs (a query) 0.
  const std::string failed_id = failed->Output().substr(0, failed->Output().find('\n'));
  auto followed = RunCli({"logs", "--master", address_, failed_id, "-f"}, "logs-f");
  EXPECT_EQ(followed->Wait(), 1) << followed->Output();
  EXPECT_NE(followed->Output().find("[" + failed_id + "] FAILED: worker w-cli (node 0)"), std::string::npos)
      << followed->Output();
  // The reason once: the error line points at it (it repeated it).
  EXPECT_NE(followed->Output().find("tessera: job " + failed_id + " FAILED (the line above says why)\n"),
            std::string::npos)
      << followed->Output();
  EXPECT_EQ(followed->Output().find("INTERNAL: test runner"), followed->Output().rfind("INTERNAL: test runner"))
      << followed->Output();
  auto queried = RunCli({"logs", "--master", address_, failed_id}, "logs-q");
  EXPECT_EQ(queried->Wait(), 0) << queried->Output();

  // SIGTERM: the worker stops cleanly (exit 0), and the master notices.
  worker.Signal(SIGTERM);
  EXPECT_EQ(worker.Wait(), 0) << worker.Output();
  EXPECT_TRUE(WaitWorkers(0));
}

// A master that stops answering (SIGSTOP: its socket still accepts, so
// TCP alone would wait hours) ends a Watch UNAVAILABLE within about twice
// the client's keepalive; a job that no event wakes (it waits for devices
// forever) is the case that hung.
TEST_F(MultiprocessTest, AWatchEndsWhenItsMasterStopsAnswering) {
  Deadline deadline(seconds(30), "a stopped master");
  Client::Options options;
  auto master = StartMasterProcess({"--state-dir", (dir_ / "state").string()}, "master", &options.master);
  ASSERT_FALSE(options.master.empty()) << master->Output();
  options.keepalive = absl::Seconds(1);
  Client client(options);
  auto job = client.Submit(R"({"devices_needed": 100})", {});
  ASSERT_TRUE(job.ok()) << job.status() << " " << options.master;
  std::atomic<int> events = 0;
  absl::Status watched;
  std::thread watcher([&] {
    watched = client.Watch(*job, [&](const control::JobEvent&) {
      ++events;
      return true;
    });
  });
  ASSERT_TRUE(WaitUntil([&] { return events > 0; }));
  master->Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  watcher.join();
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(6));
  EXPECT_EQ(watched.code(), absl::StatusCode::kUnavailable) << watched;
  master->Signal(SIGCONT);
  master->Signal(SIGINT);
  EXPECT_EQ(master->Wait(), 0) << master->Output();
}

// A master that was stopped longer than the worker timeout (SIGSTOP, a
// suspended machine) does not count the heartbeats it could not receive
// against its workers: it says it did not run, and the workers stay.
TEST_F(MultiprocessTest, AMasterThatDidNotRunDoesNotLoseItsWorkers) {
  Deadline deadline(seconds(40), "a stopped master");
  Client::Options options;
  // Stopped 2.5 s: past the master's worker timeout (1 s), well inside the
  // worker's own 5 s for its master (3.5 s against 2 s left too little room
  // on a loaded machine: the worker gave the master up).
  auto master =
      StartMasterProcess({"--worker-timeout-ms", "1000", "--heartbeat-ms", "200"}, "paused_master", &options.master);
  ASSERT_FALSE(options.master.empty()) << master->Output();
  Client client(options);
  Process worker({"worker", "--master", options.master, "--devices", "cpu:1", "--id", "w-p"}, dir_ / "w-p.out");
  const auto registered = [&] {
    auto workers = client.ListWorkers();
    return workers.ok() && workers->size() == 1;
  };
  ASSERT_TRUE(WaitUntil(registered)) << worker.Output();
  master->Signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  master->Signal(SIGCONT);
  ASSERT_TRUE(WaitUntil([&] { return master->Output().find("the master did not run for") != std::string::npos; }))
      << master->Output();
  EXPECT_EQ(master->Output().find("lost"), std::string::npos) << master->Output();
  EXPECT_TRUE(registered());
  master->Signal(SIGINT);
  EXPECT_EQ(master->Wait(), 0) << master->Output();
}

TEST_F(MultiprocessTest, MasterDaemonStopsOnSigint) {
  Deadline deadline(seconds(20), "the master verb");
  auto master = RunCli({"master", "--listen", "127.0.0.1:0", "--state-dir", (dir_ / "state").string()}, "master");
  ASSERT_TRUE(WaitUntil([&] { return master->Output().find("master listening on 127.0.0.1:") != std::string::npos; }))
      << master->Output();
  master->Signal(SIGINT);
  EXPECT_EQ(master->Wait(), 0) << master->Output();
}

}  // namespace
}  // namespace tessera::cluster::testing
