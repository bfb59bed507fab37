// The control plane in one process: master, workers and client over
// loopback gRPC, with the test doubles of test_doubles.h.

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster/device_offer.h"
#include "cluster/grpc_status.h"
#include "cluster/kv_client.h"
#include "cluster/metrics_http.h"
#include "cluster/transport.h"
#include "comm/proto/control.grpc.pb.h"
#include "core/file_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_interceptor.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/deadline.h"

namespace tessera::cluster::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using tessera::testing::Deadline;

fs::path TempDir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / absl::StrCat("tessera_cluster_", name, "_", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A client's options for the master at `address` (no security).
Client::Options ClientOptionsFor(const std::string& address) {
  Client::Options options;
  options.master = address;
  return options;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ClusterTest, WorkersRegisterAndHeartbeat) {
  Deadline deadline(seconds(20), "register + heartbeat");
  TestCluster cluster;
  cluster.Start({"cpu:2", "cpu:1"});
  auto workers = cluster.client->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  std::multiset<std::string> devices;
  for (const auto& w : *workers) devices.insert(w.devices());
  EXPECT_EQ(devices, (std::multiset<std::string>{"cpu:1", "cpu:2"}));
  // Heartbeats keep arriving: the last one is always recent.
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto again = cluster.client->ListWorkers();
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(again->size(), 2u);
    for (const auto& w : *again) EXPECT_LT(w.last_heartbeat_ms_ago(), 800) << w.worker_id();
  }
}

TEST(ClusterTest, JobSucceedsWithMetricsStreamedAndWritten) {
  Deadline deadline(seconds(20), "a job to SUCCEEDED");
  const fs::path out = TempDir("outputs") / "run";
  TestCluster cluster;
  cluster.Start({"cpu:2"});
  const std::string config = nlohmann::json{{"devices_needed", 2}, {"iterations", 8}, {"output_dir", out.string()}}.dump();
  auto job = cluster.client->Submit(config, {"iterations=6"});
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<control::JobState> states;
  std::vector<int64_t> iterations;
  std::vector<std::string> logs;
  const absl::Status watched = cluster.client->Watch(*job, [&](const control::JobEvent& event) {
    if (event.has_state()) states.push_back(event.state().state());
    if (event.has_metrics()) iterations.push_back(event.metrics().iteration());
    if (event.has_log_line()) logs.push_back(event.log_line());
    return true;
  });
  ASSERT_TRUE(watched.ok()) << watched;
  EXPECT_EQ(states, (std::vector<control::JobState>{control::PENDING, control::COMPILING, control::RUNNING,
                                                     control::SUCCEEDED}));
  EXPECT_EQ(iterations, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));  // the override won
  ASSERT_FALSE(logs.empty());
  EXPECT_EQ(logs.front(), "[node 0] node 0 starts 6 iterations");
  auto info = cluster.client->Get(*job);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->iteration(), 6);
  EXPECT_DOUBLE_EQ(info->last_metrics().at("loss"), 10.0 / 6);
  // Its keys went as it ended; a node writing more after (stopping) is
  // refused, not kept for good.
  KvClient late(MakeChannel(cluster.address, {}), {}, *job + "/1/");
  const absl::Status put = late.Set("stop/0", "late");
  EXPECT_EQ(put.code(), absl::StatusCode::kFailedPrecondition) << put;
  EXPECT_NE(put.message().find("kv: job " + *job + " already ended"), std::string::npos) << put;
  // An evaluation's row (its eval_* values alone) keeps the loss and
  // throughput beside it (they were gone from status and /metrics until
  // the next logged iteration).
  auto evaluated = cluster.client->Submit(
      nlohmann::json{{"devices_needed", 2}, {"iterations", 3}, {"evaluate_at_end", true}}.dump(), {});
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  ASSERT_TRUE(cluster.client->Watch(*evaluated, [](const control::JobEvent&) { return true; }).ok());
  auto evaluated_info = cluster.client->Get(*evaluated);
  ASSERT_TRUE(evaluated_info.ok());
  EXPECT_EQ(evaluated_info->state(), control::SUCCEEDED) << evaluated_info->reason();
  EXPECT_DOUBLE_EQ(evaluated_info->last_metrics().at("eval_loss"), 1.25);
  EXPECT_DOUBLE_EQ(evaluated_info->last_metrics().at("loss"), 10.0 / 3);
  EXPECT_DOUBLE_EQ(evaluated_info->last_metrics().at("tokens_per_s"), 1000.0);

  const auto config_json = nlohmann::json::parse(ReadFile(out / "config.json"));
  EXPECT_EQ(config_json["iterations"], 6);
  std::istringstream metrics(ReadFile(out / "metrics.jsonl"));
  std::string line;
  int64_t expected_iter = 1;
  while (std::getline(metrics, line)) {
    const auto row = nlohmann::json::parse(line);
    EXPECT_EQ(row["iter"], expected_iter++);
    EXPECT_TRUE(row.contains("loss"));
  }
  EXPECT_EQ(expected_iter, 7);
  EXPECT_NE(ReadFile(out / "log.txt").find("[node 0] node 0 done"), std::string::npos);
  fs::remove_all(out.parent_path());
}

// Fails the first try of chosen Report calls of a worker's channel as a
// flaky network would: the metrics of iteration `lost_before` never reach
// the master (sent as a report of no worker there, refused), those of
// `lost_after` are applied there and their answer lost; the worker sees
// both UNAVAILABLE. Each Report call waits `delay` first (a slow master).
// `rewrite`, where set, may change a report of metrics before it goes (a
// worker sending what it should not); the master's answer to each report
// of metrics is kept by its iteration. While `hung` is set, every Report and
// Heartbeat waits 1.5 s and fails DEADLINE_EXCEEDED, a report never
// reaching the master (a master that stopped answering).
class FlakyReports final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  FlakyReports(int64_t lost_before, int64_t lost_after, absl::Duration delay = absl::ZeroDuration())
      : lost_before_(lost_before), lost_after_(lost_after), delay_(delay) {}
  int failed() const { return failed_; }
  std::function<void(control::ReportRequest&)> rewrite;
  std::atomic<bool> hung{false};
  std::map<int64_t, grpc::StatusCode> answers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return answers_;
  }

  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo* info) override {
    const std::string method = info->method();
    if (method == "/tessera.control.Master/Heartbeat") return new Call(this, /*report=*/false);
    if (method != "/tessera.control.Master/Report") return nullptr;
    return new Call(this, /*report=*/true);
  }

 private:
  class Call final : public grpc::experimental::Interceptor {
   public:
    Call(FlakyReports* flaky, bool report) : flaky_(flaky), report_(report) {}
    void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
      using Hook = grpc::experimental::InterceptionHookPoints;
      if (methods->QueryInterceptionHookPoint(Hook::PRE_SEND_MESSAGE) && flaky_->hung) {
        hung_ = true;
        absl::SleepFor(absl::Milliseconds(1500));
        if (report_) {
          swapped_ = *static_cast<const control::ReportRequest*>(methods->GetSendMessage());
          swapped_.set_worker_id("never-arrives");
          methods->ModifySendMessage(&swapped_);
        }
      }
      if (hung_ && methods->QueryInterceptionHookPoint(Hook::POST_RECV_STATUS)) {
        *methods->GetRecvStatus() = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: the master hangs");
      }
      if (hung_ || !report_) {
        methods->Proceed();
        return;
      }
      if (methods->QueryInterceptionHookPoint(Hook::PRE_SEND_MESSAGE)) {
        absl::SleepFor(flaky_->delay_);
        const auto* report = static_cast<const control::ReportRequest*>(methods->GetSendMessage());
        if (report != nullptr && report->metrics_size() == 1) {
          const int64_t iteration = report->metrics(0).iteration();
          iteration_ = iteration;
          if (flaky_->rewrite) {
            swapped_ = *report;
            flaky_->rewrite(swapped_);
            methods->ModifySendMessage(&swapped_);
          }
          if ((iteration == flaky_->lost_before_ || iteration == flaky_->lost_after_) &&
              flaky_->tried_.insert(iteration).second) {
            fail_ = true;
            ++flaky_->failed_;
            if (iteration == flaky_->lost_before_) {
              if (!flaky_->rewrite) swapped_ = *report;
              swapped_.set_worker_id("lost-on-the-way");
              methods->ModifySendMessage(&swapped_);
            }
          }
        }
      }
      if (iteration_ >= 0 && methods->QueryInterceptionHookPoint(Hook::POST_RECV_STATUS)) {
        {
          std::lock_guard<std::mutex> lock(flaky_->mu_);
          flaky_->answers_[iteration_] = methods->GetRecvStatus()->error_code();
        }
        if (fail_) *methods->GetRecvStatus() = grpc::Status(grpc::StatusCode::UNAVAILABLE, "test: connection reset");
      }
      methods->Proceed();
    }

   private:
    FlakyReports* flaky_;
    const bool report_;
    bool hung_ = false;
    bool fail_ = false;
    int64_t iteration_ = -1;
    control::ReportRequest swapped_;
  };

  const int64_t lost_before_, lost_after_;
  const absl::Duration delay_;
  std::set<int64_t> tried_;  // (one job's reports: one thread's calls)
  std::atomic<int> failed_{0};
  mutable std::mutex mu_;
  std::map<int64_t, grpc::StatusCode> answers_;
};

// Adds a worker to `cluster` whose calls to the master go through `flaky`.
void AddFlakyWorker(TestCluster& cluster, const std::shared_ptr<FlakyReports>& flaky) {
  Worker::Options options = FastWorkerOptions(cluster.address, "cpu:1");
  options.master_channel = [address = cluster.address, flaky] {
    struct Forward final : grpc::experimental::ClientInterceptorFactoryInterface {
      std::shared_ptr<FlakyReports> to;
      grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo* info) override {
        return to->CreateClientInterceptor(info);
      }
    };
    auto forward = std::make_unique<Forward>();
    forward->to = flaky;
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(std::move(forward));
    return grpc::experimental::CreateCustomChannelWithInterceptors(address, grpc::InsecureChannelCredentials(),
                                                                   grpc::ChannelArguments(), std::move(interceptors));
  };
  cluster.workers.push_back(std::make_unique<Worker>(options, SleepyRunnerFactory(cluster.counters)));
  ASSERT_TRUE(cluster.workers.back()->Start().ok());
  ASSERT_TRUE(WaitUntil([&] { return cluster.workers.back()->registered(); }));
}

// Metrics rows whose report failed in passing are neither lost nor doubled:
// the worker tries again, the master applies each report once.
TEST(ClusterTest, AReportTriedAgainAddsItsRowOnce) {
  Deadline deadline(seconds(30), "a job with flaky reports to SUCCEEDED");
  const fs::path out = TempDir("flaky_reports") / "run";
  TestCluster cluster;
  cluster.Start({});
  auto flaky = std::make_shared<FlakyReports>(2, 4);
  ASSERT_NO_FATAL_FAILURE(AddFlakyWorker(cluster, flaky));
  const std::string config =
      nlohmann::json{{"devices_needed", 1}, {"iterations", 6}, {"output_dir", out.string()}}.dump();
  auto job = cluster.client->Submit(config, {});
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<int64_t> iterations;
  ASSERT_TRUE(cluster.client
                  ->Watch(*job,
                          [&](const control::JobEvent& event) {
                            if (event.has_metrics()) iterations.push_back(event.metrics().iteration());
                            return true;
                          })
                  .ok());
  const control::JobInfo info = cluster.WaitEnd(*job);
  EXPECT_EQ(info.state(), control::SUCCEEDED) << info.reason();
  EXPECT_EQ(flaky->failed(), 2);
  EXPECT_EQ(iterations, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  std::istringstream metrics(ReadFile(out / "metrics.jsonl"));
  std::vector<int64_t> rows;
  for (std::string line; std::getline(metrics, line);) rows.push_back(nlohmann::json::parse(line)["iter"]);
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  fs::remove_all(out.parent_path());
}

// A job's training waits on no report: with a master slow to answer
// (each report 300 ms), the runner ends at its own pace, its rows queued,
// and the job ends once they and its end are in.
TEST(ClusterTest, TrainingWaitsOnNoReport) {
  Deadline deadline(seconds(30), "a job reporting to a slow master");
  const fs::path out = TempDir("slow_reports") / "run";
  TestCluster cluster;
  cluster.Start({});
  auto flaky = std::make_shared<FlakyReports>(-1, -1, absl::Milliseconds(300));
  ASSERT_NO_FATAL_FAILURE(AddFlakyWorker(cluster, flaky));
  auto job = cluster.client->Submit(
      nlohmann::json{{"devices_needed", 1}, {"iterations", 8}, {"output_dir", out.string()}}.dump(), {});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitUntil([&] { return cluster.counters->running == 1; }));
  const absl::Time started = absl::Now();
  ASSERT_TRUE(WaitUntil([&] { return cluster.counters->running == 0; }));
  // (Its 8 rows and 2 lines take 3 s to report: a runner that waited on
  // them took as long.)
  EXPECT_LT(absl::Now() - started, absl::Seconds(1));
  const control::JobInfo info = cluster.WaitEnd(*job);
  EXPECT_EQ(info.state(), control::SUCCEEDED) << info.reason();
  EXPECT_GE(absl::Now() - started, absl::Milliseconds(2400));
  std::istringstream metrics(ReadFile(out / "metrics.jsonl"));
  std::vector<int64_t> rows;
  for (std::string line; std::getline(metrics, line);) rows.push_back(nlohmann::json::parse(line)["iter"]);
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  fs::remove_all(out.parent_path());
}

// A worker that lost its master ends the job it cancels at once: the
// reports queued for the master that lost it are not sent (each waited out
// its deadline, with retries, before the job's end could go).
TEST(ClusterTest, AJobCancelledForALostMasterWaitsOnNoQueuedReport) {
  Deadline deadline(seconds(40), "a worker losing its master");
  TestCluster cluster;
  cluster.Start({});
  auto flaky = std::make_shared<FlakyReports>(-1, -1);
  ASSERT_NO_FATAL_FAILURE(AddFlakyWorker(cluster, flaky));
  Worker& worker = *cluster.workers.back();
  auto job = cluster.client->Submit(nlohmann::json{{"devices_needed", 1}, {"iterations", 1000000}}.dump(), {});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitUntil([&] { return cluster.counters->running == 1; }));
  absl::SleepFor(absl::Milliseconds(200));
  flaky->hung = true;
  const absl::Time hung = absl::Now();
  // (Rows of 2 ms iterations queued behind the hung report: hundreds.)
  ASSERT_TRUE(WaitUntil([&] { return cluster.counters->cancelled >= 1; }, absl::Seconds(10)));
  EXPECT_TRUE(WaitUntil([&] { return worker.jobs_held() == 0; }, absl::Seconds(8)))
      << "the job was still held " << absl::Now() - hung << " after the master hung";
  flaky->hung = false;
}

// A report's metric names are bounded (each kept for the job's life and
// sent with every JobInfo: 30 MiB names broke `tessera status` for every
// job), and a report of many evaluations draws loss.svg once (drawn for
// each, under the master's lock, 2000 held the master 13 s).
TEST(ClusterTest, AReportOfUnboundedMetricsIsRefusedAndManyEvaluationsAreQuick) {
  Deadline deadline(seconds(30), "reports of odd metrics");
  const fs::path out = TempDir("odd_metrics") / "run";
  TestCluster cluster;
  cluster.Start({});
  auto flaky = std::make_shared<FlakyReports>(-1, -1);
  absl::Duration slowest;
  flaky->rewrite = [&](control::ReportRequest& report) {
    control::Metrics& row = *report.mutable_metrics(0);
    switch (row.iteration()) {
      case 2:
        (*row.mutable_values())[std::string(129, 'n')] = 1;
        break;
      case 3:
        (*row.mutable_values())["bad\nname"] = 1;
        break;
      case 4:
        for (int i = 0; i < 300; ++i) (*row.mutable_values())[absl::StrCat("m", i)] = i;
        break;
      case 5:
        for (int i = 0; i < 240; ++i) (*row.mutable_values())[absl::StrCat("m", i)] = i;
        break;
      case 6:  // (over the job's 256 with iteration 5's)
        for (int i = 0; i < 40; ++i) (*row.mutable_values())[absl::StrCat("k", i)] = i;
        break;
      case 7:
        for (int i = 0; i < 5000; ++i) {
          control::Metrics* eval = report.add_metrics();
          eval->set_iteration(7);
          (*eval->mutable_values())["eval_loss"] = 1.0 / (i + 1);
        }
        break;
    }
  };
  ASSERT_NO_FATAL_FAILURE(AddFlakyWorker(cluster, flaky));
  auto job = cluster.client->Submit(
      nlohmann::json{{"devices_needed", 1}, {"iterations", 8}, {"output_dir", out.string()}}.dump(), {});
  ASSERT_TRUE(job.ok()) << job.status();
  std::atomic<bool> done{false};
  std::thread prober([&] {
    while (!done) {
      const absl::Time sent = absl::Now();
      (void)cluster.client->Get(*job);
      slowest = std::max(slowest, absl::Now() - sent);
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  const control::JobInfo info = cluster.WaitEnd(*job);
  done = true;
  prober.join();
  EXPECT_EQ(info.state(), control::SUCCEEDED) << info.reason();
  const auto answers = flaky->answers();
  for (int64_t refused : {2, 3, 4, 6}) {
    EXPECT_EQ(answers.at(refused), grpc::StatusCode::INVALID_ARGUMENT) << "iteration " << refused;
  }
  for (int64_t taken : {1, 5, 7, 8}) EXPECT_EQ(answers.at(taken), grpc::StatusCode::OK) << "iteration " << taken;
  EXPECT_EQ(info.last_metrics().size(), 3u + 240 + 1);  // loss, samples_per_s, tokens_per_s, m0..m239, eval_loss
  EXPECT_LT(slowest, absl::Milliseconds(700));
  EXPECT_TRUE(fs::exists(out / "loss.svg"));
  fs::remove_all(out.parent_path());
}

// A registration claiming a live worker's id from another address is
// refused (two workers given one --id used to evict each other turn by
// turn, forever); ids the master gives skip ones held, as after a master
// restart workers come back with the ids it gave before.
// An ended job keeps the last 256 KiB of its events (it kept its whole
// history for the master's life): a watch of it replays the latest rows
// and its end.
TEST(ClusterTest, AnEndedJobKeepsTheTailOfItsEvents) {
  Deadline deadline(seconds(60), "an ended job's events");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto job = cluster.client->Submit(R"({"iterations": 8000, "step_ms": 0})", {});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster.client->Watch(*job, [](const control::JobEvent&) { return true; }).ok());
  std::vector<int64_t> iterations;
  size_t bytes = 0;
  control::JobState last_state = control::JOB_STATE_UNSPECIFIED;
  ASSERT_TRUE(cluster.client
                  ->Watch(*job,
                          [&](const control::JobEvent& event) {
                            bytes += event.ByteSizeLong();
                            if (event.has_metrics()) iterations.push_back(event.metrics().iteration());
                            if (event.has_state()) last_state = event.state().state();
                            return true;
                          })
                  .ok());
  EXPECT_EQ(last_state, control::SUCCEEDED);
  ASSERT_FALSE(iterations.empty());
  EXPECT_EQ(iterations.back(), 8000);
  EXPECT_GT(iterations.front(), 1) << "the whole history was kept";
  EXPECT_LE(bytes, size_t{256} << 10);
}

// A Stop names the placement it stops: a late one of an earlier placement
// (a "queued again" stop reaching the worker after the job was placed on
// it anew) leaves the current one be; one naming the current one stops it.
TEST(ClusterTest, AStopOfAnEarlierPlacementLeavesTheJobBe) {
  Deadline deadline(seconds(20), "stops by placement");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto job = cluster.client->Submit(R"({"hang": true})", {});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster.WaitState(*job, control::RUNNING));
  auto worker = control::Worker::NewStub(MakeChannel(cluster.worker_addresses[0], {}));
  const auto stop = [&](uint64_t launch) {
    grpc::ClientContext context;
    control::StopRequest request;
    request.set_job_id(*job);
    request.set_reason("test");
    request.set_launch(launch);
    control::StopResponse response;
    return worker->Stop(&context, request, &response);
  };
  ASSERT_TRUE(stop(7).ok());  // this job's placement is its first
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(cluster.client->Get(*job)->state(), control::RUNNING);
  ASSERT_TRUE(stop(1).ok());
  EXPECT_NE(cluster.WaitEnd(*job).state(), control::RUNNING);
}

TEST(ClusterTest, AnIdHeldByALiveWorkerIsRefusedAndFreshIdsSkipHeldOnes) {
  Deadline deadline(seconds(20), "worker ids");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  const std::string held = cluster.workers[0]->worker_id();
  auto stub = control::Master::NewStub(MakeChannel(cluster.address, Security{}));
  const auto reg = [&](const std::string& id, const std::string& address, control::RegisterWorkerResponse* out) {
    control::RegisterWorkerRequest request;
    request.set_worker_id(id);
    request.set_devices("cpu:1");
    request.set_worker_address(address);
    grpc::ClientContext context;
    return stub->RegisterWorker(&context, request, out);
  };
  control::RegisterWorkerResponse response;
  const grpc::Status refused = reg(held, "127.0.0.1:1", &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_NE(refused.error_message().find("is held by the live worker at " + cluster.worker_addresses[0]),
            std::string::npos)
      << refused.error_message();
  auto workers = cluster.client->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].address(), cluster.worker_addresses[0]);
  // "worker-2" taken by name, the next fresh id is worker-3.
  ASSERT_EQ(held, "worker-1");
  ASSERT_TRUE(reg("worker-2", "127.0.0.1:2", &response).ok());
  ASSERT_TRUE(reg("", "127.0.0.1:3", &response).ok());
  EXPECT_EQ(response.worker_id(), "worker-3");
}

// gRPC binds with SO_REUSEPORT unless told not to: a second master on a
// port in use would start, and calls land on either.
TEST(ClusterTest, ASecondDaemonOnAPortInUseDoesNotStart) {
  Deadline deadline(seconds(20), "port in use");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  Master::Options options = FastMasterOptions();
  options.listen = cluster.address;
  // (The --state-dir it made goes again, its .lock with it.)
  const fs::path parent = TempDir("unstarted");
  options.state_dir = (parent / "state").string();
  Master second(options, std::make_unique<FakeJobCompiler>());
  auto bound = second.Start();
  ASSERT_FALSE(bound.ok());
  EXPECT_NE(bound.status().message().find("cannot listen on '" + cluster.address + "'"), std::string::npos)
      << bound.status();
  EXPECT_FALSE(fs::exists(parent / "state"));
  fs::remove_all(parent);
  Worker::Options worker_options = FastWorkerOptions(cluster.address, "cpu:1");
  worker_options.listen = cluster.worker_addresses[0];
  Worker worker(worker_options, SleepyRunnerFactory(cluster.counters));
  EXPECT_FALSE(worker.Start().ok());
}

// Options an embedding program gets wrong are INVALID_ARGUMENT naming them,
// before any connection: a token with a newline aborted the process inside
// gRPC, port 99999 dialled 34463, a null job compiler crashed the master at
// the first submit, a worker with devices nobody could parse started and
// sat unregistered.
TEST(ClusterTest, BadOptionsOfAnEmbeddedClientMasterOrWorkerAreNamed) {
  Deadline deadline(seconds(20), "bad options");
  const auto expect = [](const absl::Status& status, const std::string& text) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message(), text);
  };
  Client::Options wrapped = ClientOptionsFor("127.0.0.1:99999");
  Client far(wrapped);
  expect(far.List().status(), "client: master address '127.0.0.1:99999': port 99999 is not in [0, 65535]");
  expect(far.Watch("job-1", [](const control::JobEvent&) { return true; }),
         "client: master address '127.0.0.1:99999': port 99999 is not in [0, 65535]");
  Client::Options newline = ClientOptionsFor("127.0.0.1:1");
  newline.security.token = "bad\ntoken";
  Client with_newline(newline);
  expect(with_newline.Submit("{}", {}).status(),
         "client: security.token: a token must be printable ASCII without spaces (byte 0x0a at offset 3); e.g. "
         "head -c 32 /dev/urandom | base64");
  // An empty callback is an error, not std::bad_function_call (SIGABRT).
  expect(Client(ClientOptionsFor("127.0.0.1:1")).Watch("job-1", nullptr),
         "Client::Watch: on_event is empty (give a callback)");
  // A job id no job has, nor protobuf sends (it printed its own lines and
  // the call failed INTERNAL).
  Client any(ClientOptionsFor("127.0.0.1:1"));
  const std::string not_utf8 =
      "a\xff"
      "b";
  expect(any.Get(not_utf8).status(), "job id 'a\\xffb' is not 1-128 characters of [A-Za-z0-9._-] (as job-000001)");
  expect(any.Cancel("job 1", "why", false).status(),
         "job id 'job 1' is not 1-128 characters of [A-Za-z0-9._-] (as job-000001)");
  expect(any.Watch("", [](const control::JobEvent&) { return true; }),
         "job id '' is not 1-128 characters of [A-Za-z0-9._-] (as job-000001)");
  expect(any.Cancel("job-1", not_utf8, false).status(), "the cancel reason is not valid UTF-8 (byte 1)");
  // A URL is no gRPC address (it was looked up as a host name).
  expect(Client(ClientOptionsFor("http://127.0.0.1:1")).List().status(),
         "client: master address 'http://127.0.0.1:1': expected HOST:PORT, or a gRPC target (dns:///, unix:, ipv4:, "
         "ipv6:), not a 'http://' URL");
  Client::Options no_time = ClientOptionsFor("127.0.0.1:1");
  no_time.timeout = absl::ZeroDuration();
  expect(Client(no_time).Get("job-1").status(), "client: timeout 0 must be > 0");

  Master no_compiler(FastMasterOptions(), nullptr);
  expect(no_compiler.Start().status(), "master: no job compiler (Master was given a null JobCompiler)");
  Master::Options listen = FastMasterOptions();
  listen.listen = "127.0.0.1:99999";
  expect(Master(listen, std::make_unique<FakeJobCompiler>()).Start().status(),
         "master: listen address '127.0.0.1:99999': port 99999 is not in [0, 65535]");
  Master::Options half_tls = FastMasterOptions();
  half_tls.security.tls_cert = "-----BEGIN CERTIFICATE-----";
  expect(Master(half_tls, std::make_unique<FakeJobCompiler>()).Start().status(),
         "master: security.tls_cert and security.tls_key go together (one alone would serve without TLS)");
  // A key given as the CA or the certificate: named (gRPC failed every
  // call with "empty address list"). The rest: security_test.
  Client::Options key_as_ca = ClientOptionsFor("127.0.0.1:1");
  key_as_ca.security.tls_ca = "-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PRIVATE KEY-----\n";
  expect(Client(key_as_ca).List().status(),
         "client: security.tls_ca: holds no CERTIFICATE block (a private key's file given for it?)");
  Master::Options key_as_cert = FastMasterOptions();
  key_as_cert.security.tls_cert = key_as_ca.security.tls_ca;
  key_as_cert.security.tls_key = key_as_ca.security.tls_ca;
  expect(Master(key_as_cert, std::make_unique<FakeJobCompiler>()).Start().status(),
         "master: security.tls_cert: holds no CERTIFICATE block (a private key's file given for it?)");
  Master::Options ipv4 = FastMasterOptions();
  ipv4.listen = "ipv4:127.0.0.1:0";
  expect(Master(ipv4, std::make_unique<FakeJobCompiler>()).Start().status(),
         "master: listen address 'ipv4:127.0.0.1:0': a server listens on HOST:PORT, dns:///HOST:PORT or unix:PATH, "
         "not ipv4:");
  {
    // A socket's address is its path (it was reported as "unix:1").
    Master::Options on_socket = FastMasterOptions();
    const std::string socket =
        absl::StrCat("unix:", fs::temp_directory_path().string(), "/tessera_master_", ::getpid(), ".sock");
    on_socket.listen = socket;
    Master master(on_socket, std::make_unique<FakeJobCompiler>());
    auto bound = master.Start();
    ASSERT_TRUE(bound.ok()) << bound.status();
    EXPECT_EQ(*bound, socket);
    auto listed = Client(ClientOptionsFor(*bound)).List();
    EXPECT_TRUE(listed.ok()) << listed.status();
    // A second daemon on the socket is refused (gRPC replaced the file: the
    // first master, still running, could be reached by nothing new).
    Master second(on_socket, std::make_unique<FakeJobCompiler>());
    EXPECT_NE(second.Start().status().message().find("another process serves that socket"), std::string::npos);
    EXPECT_TRUE(Client(ClientOptionsFor(*bound)).List().ok());
    master.Shutdown();
    // The file of one that is gone is taken over.
    EXPECT_TRUE(second.Start().ok());
    second.Shutdown();
    fs::remove(socket.substr(5));
  }
  Master::Options fast_timeout = FastMasterOptions();
  fast_timeout.worker_timeout = absl::Milliseconds(150);
  expect(Master(fast_timeout, std::make_unique<FakeJobCompiler>()).Start().status(),
         "master: worker_timeout 150ms must be at least twice heartbeat_interval 100ms");
  Master::Options no_rpc_time = FastMasterOptions();
  no_rpc_time.rpc_timeout = absl::ZeroDuration();
  expect(Master(no_rpc_time, std::make_unique<FakeJobCompiler>()).Start().status(),
         "master: rpc_timeout 0 must be a finite duration > 0");

  Worker tpu(FastWorkerOptions("127.0.0.1:1", "tpu:1"), SleepyRunnerFactory(std::make_shared<RunnerCounters>()));
  const absl::Status devices = tpu.Start().status();
  EXPECT_EQ(devices.code(), absl::StatusCode::kInvalidArgument) << devices;
  EXPECT_TRUE(std::string(devices.message()).starts_with("worker: --devices 'tpu:1': ")) << devices;
  Worker nowhere(FastWorkerOptions("", "cpu:1"), SleepyRunnerFactory(std::make_shared<RunnerCounters>()));
  EXPECT_TRUE(std::string(nowhere.Start().status().message()).starts_with("worker: master address ''"));
}

// Client::StopWatches ends every Watch in progress on that client, one that
// no event would wake included (a job that waits for devices forever).
TEST(ClusterTest, StopWatchesEndsTheWatchesInProgress) {
  Deadline deadline(seconds(20), "stop watches");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto big = cluster.client->Submit(R"({"devices_needed": 100})", {});
  ASSERT_TRUE(big.ok()) << big.status();
  std::atomic<int> events[2] = {0, 0};
  absl::Status watched[2];
  std::vector<std::thread> watchers;
  for (int i = 0; i < 2; ++i) {
    watchers.emplace_back([&, i] {
      watched[i] = cluster.client->Watch(*big, [&, i](const control::JobEvent&) {
        ++events[i];
        return true;
      });
    });
  }
  // Both are following: each saw the history (one watcher alone sees
  // two events: a watch that began after StopWatches would run on).
  ASSERT_TRUE(WaitUntil([&] { return events[0] >= 1 && events[1] >= 1; }));
  const absl::Time stopped = absl::Now();
  cluster.client->StopWatches();
  for (std::thread& t : watchers) t.join();
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(2));
  for (const absl::Status& status : watched) {
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
    EXPECT_EQ(status.message(), "watch stopped by Client::StopWatches");
  }
  // Later watches are not affected.
  EXPECT_TRUE(cluster.client
                  ->Watch(
                      *big, [](const control::JobEvent&) { return true; }, /*follow=*/false)
                  .ok());
}

// A client given a worker's address (a Worker serves no Master calls):
// gRPC's answer has no text; the error still says what is wrong (it
// printed "tessera: " alone).
TEST(ClusterTest, AClientOfTheWrongDaemonSaysSo) {
  Deadline deadline(seconds(20), "wrong daemon");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  Client client(ClientOptionsFor(cluster.worker_addresses[0]));
  const auto jobs = client.List();
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(jobs.status().message().find("the server does not serve this call"), std::string::npos) << jobs.status();
}

// Two jobs writing one train.output_dir would interleave their metrics and
// mix their checkpoints: the second is refused while the first has not
// ended, however the path is spelled.
TEST(ClusterTest, AJobMayNotShareTheOutputDirOfOneNotEnded) {
  Deadline deadline(seconds(20), "output dirs");
  const fs::path dir = TempDir("shared_output");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto first = cluster.client->Submit(R"({"hang": true, "output_dir": ")" + dir.string() + R"("})", {});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = cluster.client->Submit(R"({"output_dir": ")" + (dir / ".." / dir.filename()).string() + R"(/"})", {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("is written by job " + *first), std::string::npos) << second.status();
  ASSERT_TRUE(cluster.client->Cancel(*first).ok());
  EXPECT_EQ(cluster.WaitEnd(*first).state(), control::CANCELLED);
  auto third = cluster.client->Submit(R"({"iterations": 1, "output_dir": ")" + dir.string() + R"("})", {});
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(cluster.WaitEnd(*third).state(), control::SUCCEEDED);
  fs::remove_all(dir);
}

// A job's output_dir in the master's state directory (its config.json
// among the job records, warned about at every restart) is refused.
TEST(ClusterTest, AJobMayNotWriteIntoTheStateDir) {
  Deadline deadline(seconds(20), "output dir in the state dir");
  const fs::path state = TempDir("state_outputs");
  Master::Options options = FastMasterOptions();
  options.state_dir = state.string();
  TestCluster cluster;
  cluster.Start({"cpu:1"}, options);
  for (const fs::path& dir : {state, state / "run"}) {
    auto job = cluster.client->Submit(R"({"output_dir": ")" + dir.string() + R"("})", {});
    ASSERT_FALSE(job.ok()) << dir;
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(job.status().message(), "train.output_dir '" + dir.string() + "' is in the master's --state-dir '" +
                                          state.string() + "' (its job records): give the job a directory of its own");
  }
  EXPECT_FALSE(fs::exists(state / "run"));
  cluster.master->Shutdown();
  fs::remove_all(state);
}

// One master per state directory (a second would overwrite the first's
// records); a record that cannot be read, or a directory in its place,
// is skipped but keeps its job id from being given again.
TEST(ClusterTest, AStateDirHasOneMasterAndUnreadableRecordsKeepTheirIds) {
  Deadline deadline(seconds(20), "state dir");
  const fs::path state = TempDir("state_lock");
  Master::Options options = FastMasterOptions();
  options.state_dir = state.string();
  {
    Master first(options, std::make_unique<FakeJobCompiler>());
    ASSERT_TRUE(first.Start().ok());
    Master second(options, std::make_unique<FakeJobCompiler>());
    auto bound = second.Start();
    ASSERT_FALSE(bound.ok());
    EXPECT_NE(bound.status().message().find("is in use by another master"), std::string::npos) << bound.status();
  }
  std::ofstream(state / "job-000050.json") << "{not json";
  fs::create_directories(state / "job-000060.json");
  // A killed master's unfinished writes go; files merely like them stay.
  std::ofstream(state / "job-000050.json.tmp-4242") << "{\"id\":";
  std::ofstream(state / "last_worker_number.tmp-17") << "3";
  std::ofstream(state / "notes.tmp-") << "mine";
  std::ofstream(state / "other.tmp-5") << "mine";
  Master master(options, std::make_unique<FakeJobCompiler>());
  auto bound = master.Start();
  ASSERT_TRUE(bound.ok()) << bound.status();
  Client client(ClientOptionsFor(*bound));
  auto next = client.Submit("{}", {});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, "job-000061");
  EXPECT_EQ(ReadFile(state / "job-000050.json"), "{not json");
  EXPECT_FALSE(fs::exists(state / "job-000050.json.tmp-4242"));
  EXPECT_FALSE(fs::exists(state / "last_worker_number.tmp-17"));
  EXPECT_TRUE(fs::exists(state / "notes.tmp-"));
  EXPECT_TRUE(fs::exists(state / "other.tmp-5"));
  master.Shutdown();
  fs::remove_all(state);
}

TEST(ClusterTest, NodesMeetThroughTheMastersKv) {
  Deadline deadline(seconds(20), "a 3-node job with a KV rendezvous");
  TestCluster cluster;
  cluster.Start({"cpu:1", "cpu:1", "cpu:1"});
  auto job = cluster.client->Submit(R"({"devices_needed": 3, "rendezvous": true})", {});
  ASSERT_TRUE(job.ok()) << job.status();
  const control::JobInfo info = cluster.WaitEnd(*job);
  EXPECT_EQ(info.state(), control::SUCCEEDED) << info.reason();
  EXPECT_EQ(info.slots_size(), 3);
}

TEST(ClusterTest, TwoJobsOnDisjointWorkersRunAtOnce) {
  Deadline deadline(seconds(20), "two jobs at once");
  TestCluster cluster;
  cluster.Start({"cpu:2", "cpu:2"});
  auto a = cluster.client->Submit(R"({"devices_needed": 2, "hang": true})", {});
  auto b = cluster.client->Submit(R"({"devices_needed": 2, "hang": true})", {});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(cluster.WaitState(*a, control::RUNNING));
  ASSERT_TRUE(cluster.WaitState(*b, control::RUNNING));
  EXPECT_TRUE(WaitUntil([&] { return cluster.counters->running.load() == 2; }));
  const auto info_a = cluster.client->Get(*a), info_b = cluster.client->Get(*b);
  ASSERT_TRUE(info_a.ok() && info_b.ok());
  EXPECT_NE(info_a->slots(0).worker_id(), info_b->slots(0).worker_id());
  // A third waits (FIFO) until one of them ends, saying why, and a fourth
  // behind it says it waits for it.
  auto c = cluster.client->Submit(R"({"devices_needed": 1})", {});
  auto d = cluster.client->Submit(R"({"devices_needed": 1})", {});
  auto e = cluster.client->Submit(R"({"devices_needed": 100})", {});  // behind them too, but too big anyway
  ASSERT_TRUE(c.ok() && d.ok() && e.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cluster.client->Get(*c)->state(), control::PENDING);
  EXPECT_EQ(cluster.client->Get(*c)->reason(), "waiting: needs 1 cpu devices, 0 of the live workers' 4 are free");
  EXPECT_EQ(cluster.client->Get(*d)->reason(), "waiting: queued behind " + *c);
  EXPECT_EQ(cluster.client->Get(*e)->reason(), "waiting: needs 100 cpu devices, the live workers have 4");
  ASSERT_TRUE(cluster.client->Cancel(*a).ok());
  EXPECT_EQ(cluster.WaitEnd(*c).state(), control::SUCCEEDED);
  EXPECT_EQ(cluster.WaitEnd(*d).state(), control::SUCCEEDED);
  ASSERT_TRUE(cluster.client->Cancel(*b).ok());
  ASSERT_TRUE(cluster.client->Cancel(*e).ok());
}

TEST(ClusterTest, JobNeedingMoreDevicesThanExistStaysPendingWithoutBlocking) {
  Deadline deadline(seconds(20), "an oversized job");
  TestCluster cluster;
  cluster.Start({"cpu:2"});
  auto big = cluster.client->Submit(R"({"devices_needed": 100})", {});
  auto small = cluster.client->Submit(R"({"devices_needed": 1})", {});
  ASSERT_TRUE(big.ok() && small.ok());
  EXPECT_EQ(cluster.WaitEnd(*small).state(), control::SUCCEEDED);
  auto info = cluster.client->Get(*big);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state(), control::PENDING);
  EXPECT_EQ(info->reason(), "waiting: needs 100 cpu devices, the live workers have 2");
  // Followers see why, not only PENDING.
  std::string said;
  (void)cluster.client->Watch(*big, [&](const control::JobEvent& event) {
    if (!event.has_log_line()) return true;
    said = event.log_line();
    return false;
  });
  EXPECT_EQ(said, "[master] waiting: needs 100 cpu devices, the live workers have 2");
}

// Jobs go to workers offering their type of device: a GPU job waits for
// GPU workers (naming what it needs) without blocking CPU jobs, and runs on
// the GPU worker once one registers, never on the CPU workers.
TEST(ClusterTest, JobsGoToWorkersOfTheirDeviceType) {
  Deadline deadline(seconds(20), "jobs of two device types");
  TestCluster cluster;
  cluster.Start({"cpu:2"});
  auto gpu = cluster.client->Submit(R"({"devices_needed": 1, "device_type": "cuda"})", {});
  auto cpu = cluster.client->Submit(R"({"devices_needed": 2})", {});
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  EXPECT_EQ(cluster.WaitEnd(*cpu).state(), control::SUCCEEDED);
  auto info = cluster.client->Get(*gpu);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state(), control::PENDING);
  EXPECT_EQ(info->reason(), "waiting: needs 1 cuda devices, the live workers have 0");
  Worker* gpus = cluster.AddWorker("cuda:0-1");
  ASSERT_TRUE(WaitUntil([&] { return gpus->registered(); }));
  const control::JobInfo done = cluster.WaitEnd(*gpu);
  EXPECT_EQ(done.state(), control::SUCCEEDED) << done.reason();
  ASSERT_EQ(done.slots_size(), 1);
  EXPECT_EQ(done.slots(0).worker_id(), cluster.workers.back()->worker_id());
}

TEST(ClusterTest, RunnerFailureFailsTheJobAndStopsTheOtherWorkers) {
  Deadline deadline(seconds(20), "a failing runner");
  TestCluster cluster;
  cluster.Start({"cpu:1", "cpu:1"});
  auto job = cluster.client->Submit(R"({"devices_needed": 2, "iterations": 100000, "fail_node": 1, "fail_at": 3})", {});
  ASSERT_TRUE(job.ok());
  const control::JobInfo info = cluster.WaitEnd(*job);
  EXPECT_EQ(info.state(), control::FAILED);
  EXPECT_NE(info.reason().find("(node 1): INTERNAL: test runner: failing at iteration 3 as told"), std::string::npos)
      << info.reason();
  EXPECT_NE(info.reason().find(info.slots(1).worker_id()), std::string::npos) << info.reason();
  // Node 0 was stopped, and both workers are free and clean again.
  EXPECT_TRUE(WaitUntil([&] { return cluster.counters->live.load() == 0; }, absl::Seconds(5)));
  EXPECT_EQ(cluster.counters->cancelled.load(), 1);
  auto next = cluster.client->Submit(R"({"devices_needed": 2})", {});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(cluster.WaitEnd(*next).state(), control::SUCCEEDED);
}

TEST(ClusterTest, CompileErrorFailsTheJobWithIt) {
  Deadline deadline(seconds(20), "a compile error");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto job = cluster.client->Submit(R"({"compile_error": "no kernel for op X"})", {});
  ASSERT_TRUE(job.ok());
  const control::JobInfo info = cluster.WaitEnd(*job);
  EXPECT_EQ(info.state(), control::FAILED);
  EXPECT_EQ(info.reason(), "compile: \"no kernel for op X\"");
}

TEST(ClusterTest, BadConfigIsInvalidArgumentWithTheConfigError) {
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto job = cluster.client->Submit("{not json", {});
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(), "fake config: not a JSON object");
  auto zero = cluster.client->Submit(R"({"devices_needed": 0})", {});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClusterTest, CancelStopsTheRunnerPromptly) {
  Deadline deadline(seconds(20), "cancel");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto job = cluster.client->Submit(R"({"hang": true})", {});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WaitUntil([&] { return cluster.counters->running.load() == 1; }));
  const auto started = absl::Now();
  auto cancelled = cluster.client->Cancel(*job, "the user changed their mind");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), control::CANCELLED);
  // (Without the checkpoint a graceful cancel writes: said.)
  EXPECT_EQ(cancelled->reason(), "cancelled: the user changed their mind (at once: no further checkpoint is written)");
  EXPECT_TRUE(WaitUntil([&] { return cluster.counters->live.load() == 0; }, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - started, absl::Seconds(5));
  EXPECT_EQ(cluster.counters->cancelled.load(), 1);
  // Cancelling again: the job has ended.
  EXPECT_EQ(cluster.client->Cancel(*job).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cluster.client->Cancel("job-999999").status().code(), absl::StatusCode::kNotFound);
  // The CLI's reason reads as one phrase (it was "cancelled: cancelled from
  // the command line").
  auto second = cluster.client->Submit(R"({"hang": true})", {});
  ASSERT_TRUE(second.ok());
  auto by_cli = cluster.client->Cancel(*second, "by `tessera cancel`");
  ASSERT_TRUE(by_cli.ok()) << by_cli.status();
  EXPECT_TRUE(by_cli->reason().starts_with("cancelled by `tessera cancel`")) << by_cli->reason();
  // A reason is kept as one line: a client's newline forged a second line
  // in `tessera status`, its escape sequences reached the terminal, and a
  // NUL cut the rest off.
  auto third = cluster.client->Submit(R"({"hang": true})", {});
  ASSERT_TRUE(third.ok());
  auto forged = cluster.client->Cancel(*third, std::string("line1\nFAKE job-000001 SUCCEEDED\x1b[2J\0nul", 39));
  ASSERT_TRUE(forged.ok()) << forged.status();
  // (Running by then or not: " (at once: ...)" follows where it was.)
  EXPECT_TRUE(forged->reason().starts_with("cancelled: line1 FAKE job-000001 SUCCEEDED\\x1b[2J\\x00nul"))
      << forged->reason();
  EXPECT_EQ(forged->reason().find('\n'), std::string::npos);
}

TEST(ClusterTest, WorkerShutdownFailsItsJobNamingIt) {
  Deadline deadline(seconds(20), "a worker that goes away");
  TestCluster cluster;
  cluster.Start({"cpu:1", "cpu:1"});
  auto job = cluster.client->Submit(R"({"devices_needed": 2, "hang": true})", {});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(cluster.WaitState(*job, control::RUNNING));
  const std::string gone = cluster.workers[1]->worker_id();
  cluster.workers[1]->Shutdown();
  const control::JobInfo info = cluster.WaitEnd(*job, absl::Seconds(10));
  EXPECT_EQ(info.state(), control::FAILED);
  EXPECT_NE(info.reason().find(gone), std::string::npos) << info.reason();
  // Stopped at once, it still says farewell: not listed any more (it was
  // until its heartbeat timeout).
  auto workers = cluster.client->ListWorkers();
  ASSERT_TRUE(workers.ok());
  for (const auto& w : *workers) EXPECT_NE(w.worker_id(), gone);
  auto next = cluster.client->Submit(R"({"devices_needed": 1})", {});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(cluster.WaitEnd(*next).state(), control::SUCCEEDED);
}

// Worker::Drain (`tessera worker`'s SIGINT/SIGTERM): the master, told at
// once, stops the worker's job as a graceful cancel (both of its nodes, the
// job CANCELLED naming the worker), lists the worker as shutting down and
// places nothing more on it; Drain returns once the job has ended there.
TEST(ClusterTest, ADrainingWorkerHasItsJobStoppedAndTakesNoNewOne) {
  Deadline deadline(seconds(20), "a worker shutting down");
  TestCluster cluster;
  cluster.Start({"cpu:1", "cpu:1"});
  auto job = cluster.client->Submit(R"({"devices_needed": 2, "hang": true})", {});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(cluster.WaitState(*job, control::RUNNING));
  ASSERT_TRUE(WaitUntil([&] { return cluster.counters->running.load() == 2; }));
  const std::string leaving = cluster.workers[1]->worker_id();
  cluster.workers[1]->Drain();
  EXPECT_TRUE(WaitUntil([&] { return cluster.workers[1]->jobs_held() == 0; }, absl::Seconds(5)))
      << "its job ended there and is reaped";
  const control::JobInfo info = cluster.WaitEnd(*job, absl::Seconds(5));
  EXPECT_EQ(info.state(), control::CANCELLED);
  EXPECT_TRUE(info.reason().starts_with(absl::StrCat("worker ", leaving, " is shutting down; "))) << info.reason();
  EXPECT_TRUE(WaitUntil([&] { return cluster.counters->running.load() == 0; }, absl::Seconds(5)))
      << "the job's other node stopped too";
  auto workers = cluster.client->ListWorkers();
  ASSERT_TRUE(workers.ok());
  int draining = 0;
  for (const auto& w : *workers) draining += w.draining() ? (w.worker_id() == leaving ? 1 : 100) : 0;
  EXPECT_EQ(draining, 1);
  // Two devices are needed; only the worker staying counts.
  auto next = cluster.client->Submit(R"({"devices_needed": 2})", {});
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(WaitUntil([&] {
    auto got = cluster.client->Get(*next);
    return got.ok() && got->reason() == "waiting: needs 2 cpu devices, the live workers have 1";
  })) << "a job is not placed on a worker shutting down";
  auto small = cluster.client->Submit(R"({"devices_needed": 1})", {});
  ASSERT_TRUE(small.ok());
  const control::JobInfo ran = cluster.WaitEnd(*small);
  EXPECT_EQ(ran.state(), control::SUCCEEDED);
  ASSERT_EQ(ran.slots_size(), 1);
  EXPECT_NE(ran.slots(0).worker_id(), leaving);
  // Shut down after its drain, it says farewell: the master forgets it at
  // once (a worker started in its place may take its id).
  cluster.workers[1]->Shutdown();
  workers = cluster.client->ListWorkers();
  ASSERT_TRUE(workers.ok());
  for (const auto& w : *workers) EXPECT_NE(w.worker_id(), leaving);
}

// A worker shutting down while the job placed on it still loads: nothing
// of it ran, so it goes back to the head of the queue and runs on the
// workers that stay.
TEST(ClusterTest, AJobStillLoadingOnADrainingWorkerWaitsForOthers) {
  Deadline deadline(seconds(20), "a worker shutting down as its job loads");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto job = cluster.client->Submit(R"({"load_ms": 1000, "iterations": 2})", {});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(cluster.WaitState(*job, control::COMPILING));
  cluster.workers[0]->Drain();
  auto info = cluster.client->Get(*job);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state(), control::PENDING);
  cluster.AddWorker("cpu:1");
  const control::JobInfo ended = cluster.WaitEnd(*job);
  EXPECT_EQ(ended.state(), control::SUCCEEDED) << ended.reason();
  ASSERT_EQ(ended.slots_size(), 1);
  EXPECT_NE(ended.slots(0).worker_id(), cluster.workers[0]->worker_id());
}

// The same with a job over two workers, one of which shuts down while the
// job loads: the other drops what it loaded, and the job runs on it and a
// newcomer (no stray plan refuses the new launch).
TEST(ClusterTest, AJobLoadingOnTwoWorkersOneDrainingRunsOnTheOtherAndANewcomer) {
  Deadline deadline(seconds(30), "a two-worker job whose worker shuts down as it loads");
  TestCluster cluster;
  cluster.Start({"cpu:1", "cpu:1"});
  auto job = cluster.client->Submit(R"({"devices_needed": 2, "load_ms": 700, "iterations": 2})", {});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(cluster.WaitState(*job, control::COMPILING));
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // the first worker has loaded, the second loads
  cluster.workers[1]->Drain();
  EXPECT_TRUE(WaitUntil([&] {
    auto info = cluster.client->Get(*job);
    return info.ok() && info->state() == control::PENDING;
  }));
  cluster.AddWorker("cpu:1");
  const control::JobInfo ended = cluster.WaitEnd(*job);
  EXPECT_EQ(ended.state(), control::SUCCEEDED) << ended.reason();
  for (const auto& slot : ended.slots()) EXPECT_NE(slot.worker_id(), cluster.workers[1]->worker_id());
}

// Their log lines too (`tessera logs` after the restart): an ended job's
// from its record, a running job's from its log.txt (it showed only the
// final state).
TEST(ClusterTest, MasterRestartKeepsTheHistory) {
  Deadline deadline(seconds(30), "master restart");
  const fs::path state = TempDir("state"), outputs = TempDir("restart_outputs");
  std::string done_id, running_id, address;
  auto counters = std::make_shared<RunnerCounters>();
  {
    Master::Options options = FastMasterOptions();
    options.state_dir = state.string();
    TestCluster cluster;
    cluster.Start({"cpu:1"}, options);
    auto done = cluster.client->Submit(
        nlohmann::json{{"iterations", 2}, {"output_dir", (outputs / "done").string()}}.dump(), {});
    ASSERT_TRUE(done.ok());
    EXPECT_EQ(cluster.WaitEnd(*done).state(), control::SUCCEEDED);
    // (A later run in its directory: its log.txt is no longer the job's.)
    std::ofstream(outputs / "done" / "log.txt") << "[node 0] another run's line\n";
    auto running = cluster.client->Submit(
        nlohmann::json{{"iterations", 1000000}, {"step_ms", 5}, {"output_dir", (outputs / "running").string()}}.dump(),
        {});
    ASSERT_TRUE(running.ok());
    ASSERT_TRUE(WaitUntil([&] {
      auto info = cluster.client->Get(*running);
      return info.ok() && info->state() == control::RUNNING && info->iteration() >= 1;
    }));
    done_id = *done;
    running_id = *running;
    cluster.master->Shutdown();
    // The worker loses the master and cancels its job.
    EXPECT_TRUE(WaitUntil([&] { return cluster.counters->live.load() == 0; }, absl::Seconds(5)));
  }
  // A run resumed into the running job's directory while the master was
  // down appends its own lines: not the job's.
  std::ofstream(outputs / "running" / "log.txt", std::ios::app) << "[node 0] a later run's line\n";
  Master::Options options = FastMasterOptions();
  options.state_dir = state.string();
  Master master(options, std::make_unique<FakeJobCompiler>());
  auto bound = master.Start();
  ASSERT_TRUE(bound.ok()) << bound.status();
  Client client(ClientOptionsFor(*bound));
  auto jobs = client.List();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job_id(), done_id);
  EXPECT_EQ((*jobs)[0].state(), control::SUCCEEDED);
  EXPECT_EQ((*jobs)[1].job_id(), running_id);
  EXPECT_EQ((*jobs)[1].state(), control::FAILED);
  // How far it got is in its record (kept every few seconds of progress).
  EXPECT_TRUE((*jobs)[1].reason().starts_with("master restarted (the job had reached iteration "))
      << (*jobs)[1].reason();
  EXPECT_TRUE((*jobs)[1].reason().ends_with("; `tessera submit --resume` continues from its latest checkpoint)"))
      << (*jobs)[1].reason();
  EXPECT_GE((*jobs)[1].iteration(), 1);
  auto lines_of = [&](const std::string& id) {
    std::vector<std::string> lines;
    EXPECT_TRUE(client
                    .Watch(
                        id,
                        [&](const control::JobEvent& event) {
                          if (event.has_log_line()) lines.push_back(event.log_line());
                          return true;
                        },
                        /*follow=*/false)
                    .ok());
    return lines;
  };
  EXPECT_EQ(lines_of(done_id),
            (std::vector<std::string>{"[node 0] node 0 starts 2 iterations", "[node 0] node 0 done"}));
  const std::vector<std::string> running_lines = lines_of(running_id);
  ASSERT_FALSE(running_lines.empty());
  EXPECT_EQ(running_lines.front(), "[node 0] node 0 starts 1000000 iterations");
  EXPECT_EQ(std::count(running_lines.begin(), running_lines.end(), "[node 0] a later run's line"), 0);
  // New jobs get new ids.
  auto next = client.Submit("{}", {});
  ASSERT_TRUE(next.ok());
  EXPECT_NE(*next, done_id);
  EXPECT_NE(*next, running_id);
  master.Shutdown();
  fs::remove_all(state);
  fs::remove_all(outputs);
}

// A state directory's damaged job records are skipped, each named with
// the field that is wrong (it quoted nlohmann's "cannot use at() with
// discarded", and listed a job at iteration -5); a diverged job (its loss
// NaN, written as null) is kept.
TEST(ClusterTest, DamagedJobRecordsAreSkippedNamingTheField) {
  Deadline deadline(seconds(30), "damaged job records");
  const fs::path state = TempDir("damaged_state");
  std::string done_id;
  {
    Master::Options options = FastMasterOptions();
    options.state_dir = state.string();
    TestCluster cluster;
    cluster.Start({"cpu:1"}, options);
    auto done = cluster.client->Submit(R"({"iterations": 2})", {});
    ASSERT_TRUE(done.ok());
    EXPECT_EQ(cluster.WaitEnd(*done).state(), control::SUCCEEDED);
    done_id = *done;
  }
  const nlohmann::json record = nlohmann::json::parse(ReadFile(state / (done_id + ".json")));
  int session = 100;
  auto write = [&](const std::string& id, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json copy = record;
    copy["job_id"] = id;
    copy["session"] = ++session;
    edit(copy);
    std::ofstream(state / (id + ".json")) << copy.dump();
  };
  write("job-000101", [](nlohmann::json& r) { r["iteration"] = -5; });
  write("job-000102", [](nlohmann::json& r) { r.erase("reason"); });
  write("job-000103", [](nlohmann::json& r) { r["slots"] = 3; });
  write("job-000104", [](nlohmann::json& r) { r["slots"][0]["num_devices"] = "2"; });
  write("job-000105", [](nlohmann::json& r) { r["state"] = "DONE"; });
  write("job-000106", [](nlohmann::json& r) { r["last_metrics"] = {{"loss", nullptr}}; });
  std::ofstream(state / "job-000107.json") << "{\"job_id\": ";
  // (A field read only for jobs a restart ends or queues again: nlohmann's
  // exception stopped the master, naming neither file nor field.)
  write("job-000108", [](nlohmann::json& r) {
    r["state"] = "RUNNING";
    r["output_dir_made"] = "yes";
  });

  std::ostringstream logged;
  const auto saved = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(logged, /*force_flush=*/true)));
  Master::Options options = FastMasterOptions();
  options.state_dir = state.string();
  Master master(options, std::make_unique<FakeJobCompiler>());
  auto bound = master.Start();
  spdlog::set_default_logger(saved);
  ASSERT_TRUE(bound.ok()) << bound.status();
  Client client(ClientOptionsFor(*bound));
  auto jobs = client.List();
  ASSERT_TRUE(jobs.ok());
  std::vector<std::string> ids;
  for (const auto& job : *jobs) ids.push_back(job.job_id());
  EXPECT_EQ(ids, (std::vector<std::string>{done_id, "job-000106"}));
  const std::string log = logged.str();
  for (const std::string expected : {
           "job-000101.json: not a job record ('iteration' -5 is not in [0, ",
           "job-000102.json: not a job record ('reason' is missing)",
           "job-000103.json: not a job record ('slots' is not an array)",
           "job-000104.json: not a job record ('slots[0].num_devices' is not an integer)",
           "job-000105.json: not a job record ('state' 'DONE' is no job state)",
           "job-000107.json: not a job record (not valid JSON (cut short or damaged))",
           "job-000108.json: not a job record ('output_dir_made' is not true or false)",
       }) {
    EXPECT_NE(log.find(expected), std::string::npos) << expected << "\n" << log;
  }
  EXPECT_EQ(log.find("json.exception"), std::string::npos) << log;
  // A new job's id comes after every record's, read or not.
  auto next = client.Submit("{}", {});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, "job-000109");
  master.Shutdown();
  fs::remove_all(state);
}

// A master without a state directory: no next master learns of its queued
// jobs, so its shutdown cancels them, saying why (they went silently).
TEST(ClusterTest, ADrainingMasterWithoutAStateDirCancelsItsQueuedJobs) {
  Deadline deadline(seconds(30), "a master without a state directory shutting down");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto queued = cluster.client->Submit(R"({"devices_needed": 2})", {});  // never placed
  ASSERT_TRUE(queued.ok());
  ASSERT_TRUE(cluster.WaitState(*queued, control::PENDING));
  cluster.master->Drain();
  auto info = cluster.client->Get(*queued);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state(), control::CANCELLED);
  EXPECT_EQ(info->reason(),
            "the master shut down before the job started (it has no --state-dir to keep queued jobs in)");
  cluster.master->Shutdown();
}

// Master::Drain (`tessera master`'s SIGINT/SIGTERM): the running job stops
// as a graceful cancel (CANCELLED, naming the master's shutdown), nothing
// is submitted or placed meanwhile, and the queued job waits in its turn
// for the next master on the state directory, which runs it.
TEST(ClusterTest, ADrainingMasterStopsRunningJobsAndTheNextOneRunsTheQueue) {
  Deadline deadline(seconds(30), "a master shutting down");
  const fs::path state = TempDir("drain_state");
  std::string running_id, queued_id;
  {
    Master::Options options = FastMasterOptions();
    options.state_dir = state.string();
    TestCluster cluster;
    cluster.Start({"cpu:1"}, options);
    auto running = cluster.client->Submit(R"({"hang": true})", {});
    ASSERT_TRUE(running.ok());
    ASSERT_TRUE(cluster.WaitState(*running, control::RUNNING));
    auto queued = cluster.client->Submit(R"({"iterations": 2})", {});
    ASSERT_TRUE(queued.ok());
    running_id = *running;
    queued_id = *queued;
    cluster.master->Drain();
    auto info = cluster.client->Get(running_id);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->state(), control::CANCELLED);
    EXPECT_TRUE(info->reason().starts_with("the master is shutting down; ")) << info->reason();
    // The worker was free, yet the queued job was not placed.
    info = cluster.client->Get(queued_id);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->state(), control::PENDING);
    EXPECT_EQ(cluster.client->Submit("{}", {}).status().code(), absl::StatusCode::kUnavailable);
    cluster.master->Shutdown();
  }
  Master::Options options = FastMasterOptions();
  options.state_dir = state.string();
  TestCluster cluster;
  cluster.Start({"cpu:1"}, options);
  auto info = cluster.client->Get(queued_id);
  ASSERT_TRUE(info.ok());
  const control::JobInfo ended = cluster.WaitEnd(queued_id);
  EXPECT_EQ(ended.state(), control::SUCCEEDED) << ended.reason();
  std::vector<std::string> said;
  ASSERT_TRUE(cluster.client
                  ->Watch(
                      queued_id,
                      [&](const control::JobEvent& event) {
                        if (event.has_log_line()) said.push_back(event.log_line());
                        return true;
                      },
                      /*follow=*/false)
                  .ok());
  EXPECT_NE(std::find(said.begin(), said.end(), "[master] queued again after a master restart"), said.end());
  info = cluster.client->Get(running_id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state(), control::CANCELLED);
  fs::remove_all(state);
}

// A job whose nodes stopped at an iteration boundary (a signalled
// process) shows that iteration as its progress, not its last logged one.
TEST(ClusterTest, AJobStoppedAtABoundaryShowsThatIterationAsItsProgress) {
  Deadline deadline(seconds(30), "a job interrupted between logged iterations");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  auto job = cluster.client->Submit(R"({"iterations": 100, "interrupt_at": 7, "log_every": 5})", {});
  ASSERT_TRUE(job.ok()) << job.status();
  const control::JobInfo ended = cluster.WaitEnd(*job);
  EXPECT_EQ(ended.state(), control::CANCELLED) << ended.reason();
  EXPECT_NE(ended.reason().find("interrupted at iteration 7"), std::string::npos) << ended.reason();
  EXPECT_EQ(ended.iteration(), 7) << "the last logged iteration was 5";
}

// A job's progress shows between its logged iterations: the workers'
// heartbeats carry the iterations their nodes have completed (it stayed at
// 0 for a job whose log period was longer than its run so far).
TEST(ClusterTest, ProgressShowsBetweenLoggedIterations) {
  Deadline deadline(seconds(30), "progress between logged iterations");
  TestCluster cluster;
  cluster.Start({"cpu:1", "cpu:1"});
  auto job =
      cluster.client->Submit(R"({"iterations": 1000000, "step_ms": 5, "log_every": 1000000, "devices_needed": 2})", {});
  ASSERT_TRUE(job.ok()) << job.status();
  int64_t seen = 0;
  ASSERT_TRUE(WaitUntil([&] {
    auto info = cluster.client->Get(*job);
    if (info.ok()) seen = info->iteration();
    return info.ok() && info->iteration() >= 20;
  })) << "progress stayed at "
      << seen;
  auto info = cluster.client->Get(*job);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state(), control::RUNNING);
  EXPECT_TRUE(info->last_metrics().empty()) << "nothing was logged";
  ASSERT_TRUE(cluster.client->Cancel(*job).ok());
  EXPECT_EQ(cluster.WaitEnd(*job).state(), control::CANCELLED);
}

// A node killed before its first checkpoint leaves an empty checkpoints/
// (its claim never ended): the job's end removes it, and then the output
// directory the master made, when nothing else is in them. A checkpoints/
// with something in it, or one a node still holds, stays.
TEST(ClusterTest, AnEmptyCheckpointsDirectoryGoesWithItsJob) {
  Deadline deadline(seconds(30), "a killed node's empty checkpoints/");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  const fs::path root = TempDir("empty_checkpoints");
  const auto run = [&](const fs::path& out, const std::function<void()>& while_running) {
    auto job = cluster.client->Submit(nlohmann::json{{"hang", true}, {"output_dir", out.string()}}.dump(), {});
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(cluster.WaitState(*job, control::RUNNING));
    while_running();
    ASSERT_TRUE(cluster.client->Cancel(*job, "test", /*checkpoint=*/false).ok());
    EXPECT_EQ(cluster.WaitEnd(*job).state(), control::CANCELLED);
    // The directory goes once the node has let the job go (its worker free).
    EXPECT_TRUE(WaitUntil([&] {
      auto workers = cluster.client->ListWorkers();
      return workers.ok() && workers->size() == 1 && (*workers)[0].job_id().empty();
    }));
  };
  run(root / "killed", [&] { fs::create_directories(root / "killed" / "checkpoints"); });
  EXPECT_FALSE(fs::exists(root / "killed" / "checkpoints"));
  run(root / "written", [&] { fs::create_directories(root / "written" / "checkpoints" / "iter_0000001"); });
  EXPECT_TRUE(fs::exists(root / "written" / "checkpoints" / "iter_0000001"));
  std::optional<DirectoryClaim> node;
  run(root / "held", [&] {
    auto claimed = DirectoryClaim::AcquireShared(root / "held" / "checkpoints");
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    node.emplace(*std::move(claimed));
  });
  EXPECT_TRUE(fs::exists(root / "held" / "checkpoints")) << "a node still holds it";
  node->Release();
  EXPECT_FALSE(fs::exists(root / "held" / "checkpoints")) << "the node's claim made it";
  fs::remove_all(root);
}

// A queued job's output_dir, made at its submission and claimed again by
// the next master: cancelled having written nothing, the job leaves no
// directory behind (the claim remembers through the record who made it).
TEST(ClusterTest, AQueuedJobsMadeDirectoryGoesWhenItEndsAfterARestart) {
  Deadline deadline(seconds(30), "a queued job's directory over a restart");
  const fs::path state = TempDir("made_dir_state");
  const fs::path out = TempDir("made_dir_out") / "job";
  const std::string config = nlohmann::json{{"devices_needed", 4}, {"output_dir", out.string()}}.dump();
  std::string id;
  {
    Master::Options options = FastMasterOptions();
    options.state_dir = state.string();
    TestCluster cluster;
    cluster.Start({"cpu:1"}, options);
    auto queued = cluster.client->Submit(config, {});  // more devices than the worker has: it waits
    ASSERT_TRUE(queued.ok()) << queued.status();
    id = *queued;
    EXPECT_TRUE(fs::is_directory(out));
    cluster.master->Shutdown();
  }
  Master::Options options = FastMasterOptions();
  options.state_dir = state.string();
  TestCluster cluster;
  cluster.Start({"cpu:1"}, options);
  auto info = cluster.client->Get(id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), control::PENDING) << info->reason();
  ASSERT_TRUE(cluster.client->Cancel(id, "enough", /*checkpoint=*/false).ok());
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::exists(out.parent_path()));  // not one the claim made
  fs::remove_all(state);
  fs::remove_all(out.parent_path());
}

// A master restarted on the same address: the worker that outlived it
// registers again on its own and runs the next job.
TEST(ClusterTest, WorkersRegisterAgainWithARestartedMaster) {
  Deadline deadline(seconds(30), "worker re-registration");
  const fs::path state = TempDir("workers-state");
  Master::Options first = FastMasterOptions();
  first.state_dir = state.string();
  TestCluster cluster;
  cluster.Start({"cpu:1"}, first);
  const std::string address = cluster.address;
  const std::string id = cluster.workers[0]->worker_id();
  cluster.master->Shutdown();
  EXPECT_TRUE(WaitUntil([&] { return !cluster.workers[0]->registered(); }, absl::Seconds(5)))
      << "the worker did not notice the master go";
  Master::Options options = FastMasterOptions();
  options.state_dir = state.string();
  options.listen = address;
  cluster.master = std::make_unique<Master>(options, std::make_unique<FakeJobCompiler>());
  auto bound = cluster.master->Start();
  ASSERT_TRUE(bound.ok()) << bound.status();
  ASSERT_EQ(*bound, address);
  ASSERT_TRUE(WaitUntil([&] { return cluster.workers[0]->registered(); }, absl::Seconds(10)))
      << "the worker did not register again";
  auto workers = cluster.client->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].worker_id(), id);
  auto job = cluster.client->Submit(R"({"iterations": 2})", {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(cluster.WaitEnd(*job).state(), control::SUCCEEDED);
  // The worker leaves, the master restarts again: a new worker gets a number
  // no master of this state directory gave (it keeps the last one), so the
  // job records name workers unambiguously.
  cluster.workers.clear();
  cluster.master->Shutdown();
  cluster.master = std::make_unique<Master>(options, std::make_unique<FakeJobCompiler>());
  ASSERT_TRUE(cluster.master->Start().ok());
  Worker* fresh = cluster.AddWorker("cpu:1");
  ASSERT_TRUE(WaitUntil([&] { return fresh->registered(); }));
  EXPECT_EQ(fresh->worker_id(), "worker-2");
  auto history = cluster.client->Get(*job);
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->slots_size(), 1);
  EXPECT_EQ(history->slots(0).worker_id(), id);
}

// A state directory's worker number file is read as a regular file of a
// number: /dev/zero in its place was read without end (gigabytes) before
// any signal could stop the master, and a FIFO was waited on.
TEST(ClusterTest, AStateDirectoryFileThatIsNoFileIsRefused) {
  Deadline deadline(seconds(20), "state dir");
  const fs::path state = TempDir("zero-state");
  fs::create_directories(state);
  fs::create_symlink("/dev/zero", state / "last_worker_number");
  Master::Options options = FastMasterOptions();
  options.state_dir = state.string();
  const absl::Status zero = Master(options, std::make_unique<FakeJobCompiler>()).Start().status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kFailedPrecondition) << zero;
  EXPECT_NE(zero.message().find("--state-dir: " + (state / "last_worker_number").string() + ": not a regular file"),
            std::string::npos)
      << zero;
  fs::remove_all(state);
  // Its lock a directory: named (it said the directory was not writable).
  fs::create_directories(state / ".lock");
  const absl::Status locked = Master(options, std::make_unique<FakeJobCompiler>()).Start().status();
  EXPECT_EQ(locked.code(), absl::StatusCode::kFailedPrecondition) << locked;
  EXPECT_NE(locked.message().find("': cannot open its lock " + (state / ".lock").string() + ": Is a directory"),
            std::string::npos)
      << locked;
  fs::remove_all(state);
}

TEST(ClusterTest, KvPutGetWait) {
  Deadline deadline(seconds(20), "kv");
  TestCluster cluster;
  cluster.Start({});
  // (Queued: no worker. Only a job's keys are written, JOB/SESSION/NAME.)
  auto job = cluster.client->Submit(nlohmann::json{{"devices_needed", 1}}.dump(), {});
  auto other_job = cluster.client->Submit(nlohmann::json{{"devices_needed", 1}}.dump(), {});
  ASSERT_TRUE(job.ok() && other_job.ok());
  KvClient kv(MakeChannel(cluster.address, {}), {}, *job + "/1/");
  EXPECT_EQ(kv.Get("a").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(kv.Set("a", "1").ok());
  EXPECT_EQ(*kv.Get("a"), "1");
  const auto started = absl::Now();
  auto missing = kv.Wait({"a", "b"}, absl::Milliseconds(300));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find(*job + "/1/b"), std::string::npos) << missing.status();
  EXPECT_GE(absl::Now() - started, absl::Milliseconds(290));
  // Many long keys unset: the message names a few, cut, and fits gRPC's
  // 8 KiB of metadata (the client read "metadata size exceeds limit").
  std::vector<std::string> long_keys;
  for (char c = 'a'; c < 'a' + 12; ++c) long_keys.push_back(std::string(1000, c));
  auto many = kv.Wait(long_keys, absl::Milliseconds(10));
  EXPECT_EQ(many.status().code(), absl::StatusCode::kDeadlineExceeded) << many.status();
  EXPECT_NE(many.status().message().find("..., and 8 more (never set)"), std::string::npos) << many.status();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(kv.Set("b", std::string("\0two", 4)).ok());
  });
  auto both = kv.Wait({"a", "b"}, absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ((*both)[0], "1");
  EXPECT_EQ((*both)[1], std::string("\0two", 4));
  // Another prefix does not see these keys.
  KvClient other(MakeChannel(cluster.address, {}), {}, *other_job + "/2/");
  EXPECT_EQ(other.Get("a").status().code(), absl::StatusCode::kNotFound);
  // A key of no job, or of another session of the job, would stay for good
  // (filled, the KV failed every job spanning workers): refused.
  for (const std::string& prefix : std::vector<std::string>{"junk/", "junk/1/", *job + "/2/", *job + "/x/", "/1/"}) {
    KvClient stray(MakeChannel(cluster.address, {}), {}, prefix);
    const absl::Status put = stray.Set("a", "1");
    EXPECT_EQ(put.code(), absl::StatusCode::kFailedPrecondition) << prefix << ": " << put;
    EXPECT_NE(put.message().find("is not a job's (JOB/SESSION/NAME"), std::string::npos) << put;
  }
  KvClient empty_name(MakeChannel(cluster.address, {}), {}, *job + "/1/");
  EXPECT_EQ(empty_name.Set("", "1").code(), absl::StatusCode::kFailedPrecondition);
}

// The KV holds at most Options.max_kv_bytes of keys and values: a client
// filling it gets RESOURCE_EXHAUSTED, not the master's memory; replacing a
// value counts its new size only.
TEST(ClusterTest, TheKvIsBounded) {
  Deadline deadline(seconds(20), "kv bound");
  Master::Options options = FastMasterOptions();
  options.max_kv_bytes = 1000;
  TestCluster cluster;
  cluster.Start({"cpu:1"}, options);
  auto job = cluster.client->Submit(nlohmann::json{{"devices_needed", 2}}.dump(), {});  // (queued)
  ASSERT_TRUE(job.ok()) << job.status();
  KvClient kv(MakeChannel(cluster.address, {}), {}, *job + "/1/");
  ASSERT_TRUE(kv.Set("a", std::string(600, 'x')).ok());
  ASSERT_TRUE(kv.Set("a", std::string(900, 'y')).ok());  // replaces: 900 + the key, not 1500
  const absl::Status full = kv.Set("b", std::string(200, 'z'));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("holds at most 1000 bytes"), std::string::npos) << full;
  ASSERT_TRUE(kv.Set("a", "small").ok());
  EXPECT_TRUE(kv.Set("b", std::string(200, 'z')).ok());
}

// Calls that wait (KvWait, WatchJob) each hold a thread of the master:
// past Options.max_waiting_calls they are RESOURCE_EXHAUSTED at once (10,000
// KvWaits took 10,000 threads), other calls are still answered, and the
// KV's client asks again until its wait's time is up.
TEST(ClusterTest, WaitingCallsAreCappedAndTheKvAsksAgain) {
  Deadline deadline(seconds(30), "waiting calls");
  Master::Options options = FastMasterOptions();
  options.max_waiting_calls = 3;
  TestCluster cluster;
  cluster.Start({}, options);
  auto job = cluster.client->Submit(nlohmann::json{{"devices_needed", 1}}.dump(), {});  // (queued)
  ASSERT_TRUE(job.ok()) << job.status();
  KvClient kv(MakeChannel(cluster.address, {}), {}, *job + "/1/");
  std::vector<std::thread> waiters;
  std::atomic<int> answered{0};
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&] {
      auto got = kv.Wait({"w"}, absl::Seconds(20));
      EXPECT_TRUE(got.ok()) << got.status();
      if (got.ok() && (*got)[0] == "v") ++answered;
    });
  }
  // Once the three are held, a fourth wait is refused at once.
  auto stub = control::Master::NewStub(MakeChannel(cluster.address, Security{}));
  grpc::Status refused;
  for (int tries = 0; tries < 200; ++tries) {
    control::KvWaitRequest request;
    request.add_keys(*job + "/1/other");
    request.set_timeout_ms(0);
    control::KvWaitResponse response;
    grpc::ClientContext context;
    refused = stub->KvWait(&context, request, &response);
    if (refused.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("at most 3 waiting calls (KvWait, WatchJob)"), std::string::npos)
      << refused.error_message();
  // A watch that follows is one too; one of the history is not held.
  const absl::Status watch = cluster.client->Watch(*job, [](const control::JobEvent&) { return true; });
  EXPECT_EQ(watch.code(), absl::StatusCode::kResourceExhausted) << watch;
  EXPECT_TRUE(cluster.client
                  ->Watch(
                      *job, [](const control::JobEvent&) { return true; }, false)
                  .ok());
  // Other calls are answered.
  const auto asked = absl::Now();
  EXPECT_TRUE(cluster.client->Get(*job).ok());
  EXPECT_LT(absl::Now() - asked, absl::Seconds(2));
  // A fourth waiter through the KV's client asks again until a place frees.
  waiters.emplace_back([&] {
    auto got = kv.Wait({"w"}, absl::Seconds(20));
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok() && (*got)[0] == "v") ++answered;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(kv.Set("w", "v").ok());
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(answered.load(), 4);
  // Its places given back, the master takes waits again.
  auto again = kv.Wait({"w"}, absl::Seconds(1));
  EXPECT_TRUE(again.ok()) << again.status();
}

int CountEntries(const char* dir) {
  int n = 0;
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

TEST(ClusterTest, TwentyJobsInARowLeaveThreadsAndFdsFlat) {
  Deadline deadline(seconds(50), "20 jobs in a row");
  TestCluster cluster;
  cluster.Start({"cpu:1", "cpu:1"});
  auto run_job = [&](int i) {
    const std::string config = i % 3 == 2 ? R"({"devices_needed": 2, "fail_node": 0, "fail_at": 1})"
                                          : R"({"devices_needed": 2, "iterations": 3, "rendezvous": true})";
    auto job = cluster.client->Submit(config, {});
    ASSERT_TRUE(job.ok());
    const auto info = cluster.WaitEnd(*job);
    EXPECT_EQ(info.state(), i % 3 == 2 ? control::FAILED : control::SUCCEEDED) << info.reason();
    ASSERT_TRUE(WaitUntil([&] {
      return cluster.counters->live.load() == 0 && cluster.workers[0]->jobs_held() == 0 &&
             cluster.workers[1]->jobs_held() == 0;
    }));
  };
  for (int i = 0; i < 3; ++i) run_job(i);  // warm up gRPC's pools
  const int threads = CountEntries("/proc/self/task"), fds = CountEntries("/proc/self/fd");
  for (int i = 3; i < 20; ++i) run_job(i);
  // gRPC's executor grows and shrinks its pools on its own (a few more
  // threads on a loaded machine): allow its slack, not a thread or fd per
  // job (17 jobs).
  EXPECT_TRUE(WaitUntil([&] { return CountEntries("/proc/self/task") <= threads + 4; }, absl::Seconds(5)))
      << CountEntries("/proc/self/task") << " threads, " << threads << " after warm-up";
  EXPECT_TRUE(WaitUntil([&] { return CountEntries("/proc/self/fd") <= fds + 2; }, absl::Seconds(5)))
      << CountEntries("/proc/self/fd") << " fds, " << fds << " after warm-up";
}

// A connected socket to 127.0.0.1:port (-1: none).
int ConnectLocal(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The answer to `request` sent as it is.
std::string HttpRaw(int port, const std::string& request) {
  const int fd = ConnectLocal(port);
  if (fd < 0) return "";
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, static_cast<size_t>(n));
  close(fd);
  return response;
}

std::string HttpGet(int port, const std::string& path, const std::string& method = "GET") {
  return HttpRaw(port, absl::StrCat(method, " ", path, " HTTP/1.0\r\n\r\n"));
}

TEST(ClusterTest, PrometheusValuesAndLabelsAreWrittenAsTheFormatReadsThem) {
  EXPECT_EQ(PrometheusValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(PrometheusValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(PrometheusValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(PrometheusValue(8), "8");
  EXPECT_EQ(PrometheusValue(0.1), "0.1");
  EXPECT_EQ(std::stod(PrometheusValue(18922.4123456789)), 18922.4123456789);  // (StrCat: 18922.4)
  EXPECT_EQ(PrometheusLabel("job-1"), "job-1");
  EXPECT_EQ(PrometheusLabel("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(ClusterTest, PrometheusMetrics) {
  Deadline deadline(seconds(20), "/metrics");
  Master::Options options = FastMasterOptions();
  options.metrics_port = 0;
  TestCluster cluster;
  cluster.Start({"cpu:1"}, options);
  auto job = cluster.client->Submit(R"({"hang": true, "step_ms": 5})", {});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(cluster.WaitState(*job, control::RUNNING));
  const std::string text = HttpGet(cluster.master->metrics_port(), "/metrics");
  EXPECT_NE(text.find("HTTP/1.0 200 OK"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_jobs{state=\"RUNNING\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_workers_alive 1"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_rpcs_total{method=\"SubmitJob\"} 1"), std::string::npos) << text;
  EXPECT_NE(HttpGet(cluster.master->metrics_port(), "/other").find("404"), std::string::npos);
  // HEAD: GET's status and headers, no body (it was a 404).
  const std::string head = HttpGet(cluster.master->metrics_port(), "/metrics", "HEAD");
  EXPECT_TRUE(head.starts_with("HTTP/1.0 200 OK")) << head;
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
  EXPECT_NE(HttpGet(cluster.master->metrics_port(), "/other", "HEAD").find("404"), std::string::npos);
  // Lines ended by a line feed alone are read (it waited out the 2 s
  // unanswered); a head over 8 KiB is answered 431 (it was reset).
  const int port = cluster.master->metrics_port();
  EXPECT_TRUE(HttpRaw(port, "GET /metrics HTTP/1.0\nHost: x\n\n").starts_with("HTTP/1.0 200 OK"));
  // A head that arrives in pieces, its empty line cut between them (never
  // answered: the search for its end went on past the cut's "\n").
  for (const std::vector<std::string>& pieces :
       {std::vector<std::string>{"GET /metrics HTTP/1.0\r\n", "Host: x\r\n", "\r\n"},
        std::vector<std::string>{"GET /metrics HTTP/1.0\n", "\n"},
        std::vector<std::string>{"GET /metrics HTTP/1.0\r\n\r", "\n"}}) {
    const int fd = ConnectLocal(port);
    ASSERT_GE(fd, 0);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (const std::string& piece : pieces) {
      EXPECT_EQ(write(fd, piece.data(), piece.size()), static_cast<ssize_t>(piece.size()));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::string response;
    char buffer[4096];
    for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, static_cast<size_t>(n));
    close(fd);
    EXPECT_TRUE(response.starts_with("HTTP/1.0 200 OK")) << pieces.size() << " pieces: '" << response << "'";
  }
  // Heads shorter than a method: 404, and the server goes on.
  for (const char* tiny : {"\n\n", "\n\r\n", "GE\n\n", "GET\n\n"}) {
    EXPECT_TRUE(HttpRaw(port, tiny).starts_with("HTTP/1.0 404 ")) << tiny;
  }
  EXPECT_TRUE(
      HttpRaw(port, "GET /metrics HTTP/1.0\r\nX: " + std::string(9000, 'a') + "\r\n\r\n").starts_with("HTTP/1.0 431 "));
  {
    // Idle connections past the most at once close the oldest: a scrape
    // still gets through at once, and the master holds at most that many.
    const absl::Time opened = absl::Now();
    std::vector<int> idle;
    for (int i = 0; i < MetricsHttpServer::kMaxConnections + 16; ++i) idle.push_back(ConnectLocal(port));
    const absl::Time scraped = absl::Now();
    EXPECT_TRUE(HttpGet(port, "/metrics").starts_with("HTTP/1.0 200 OK"));
    EXPECT_LT(absl::Now() - scraped, absl::Seconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // Closed by the server (end of stream), not by their 2 s deadline yet.
    int closed = 0;
    for (const int fd : idle) {
      char byte;
      if (fd >= 0 && recv(fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK) == 0) ++closed;
    }
    if (absl::Now() - opened < absl::Milliseconds(1500)) {
      EXPECT_GE(closed, 16) << "the oldest idle connections were not closed";
      EXPECT_LE(closed, 18);
    }
    for (const int fd : idle) close(fd);
  }
  // A running job's loss and throughput (samples/s, tokens/s) show up once
  // it reports (the fake job: every step).
  ASSERT_TRUE(cluster.client->Cancel(*job).ok());
  auto reporting = cluster.client->Submit(R"({"iterations": 100000, "step_ms": 5})", {});
  ASSERT_TRUE(reporting.ok()) << reporting.status();
  std::string reported;
  EXPECT_TRUE(WaitUntil([&] {
    reported = HttpGet(cluster.master->metrics_port(), "/metrics");
    return reported.find("tessera_job_loss{job=\"" + *reporting + "\"}") != std::string::npos;
  })) << reported;
  EXPECT_NE(reported.find("tessera_job_samples_per_second{job=\"" + *reporting + "\"} 8\n"), std::string::npos)
      << reported;
  EXPECT_NE(reported.find("tessera_job_tokens_per_second{job=\"" + *reporting + "\"} 1000\n"), std::string::npos)
      << reported;
  ASSERT_TRUE(cluster.client->Cancel(*reporting).ok());
}

// A worker's offer: a count of virtual CPU devices, or GPUs by their indices
// on the machine, which it shows its plans as cuda:0 .. count-1
// (CUDA_VISIBLE_DEVICES, composed with one already set).
TEST(DeviceOffer, ParsesOffersAndNarrowsTheVisibleGpus) {
  auto cpu = ParseDeviceOffer("cpu:4");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->type, DeviceType::kCpu);
  EXPECT_EQ(cpu->count(), 4);
  EXPECT_FALSE(CudaVisibleDevices(*cpu, std::nullopt)->has_value());
  const auto gpus_of = [](std::string_view text) {
    auto offer = ParseDeviceOffer(text);
    EXPECT_TRUE(offer.ok()) << text << ": " << offer.status();
    EXPECT_EQ(offer->type, DeviceType::kCuda);
    EXPECT_EQ(offer->count(), static_cast<int>(offer->gpus.size()));
    return offer->gpus;
  };
  EXPECT_EQ(gpus_of("cuda:0"), std::vector<int>{0});
  EXPECT_EQ(gpus_of("cuda:3"), std::vector<int>{3});
  EXPECT_EQ(gpus_of("cuda:2-3"), (std::vector<int>{2, 3}));
  EXPECT_EQ(gpus_of("cuda:0-7").size(), 8u);
  EXPECT_EQ(gpus_of("cuda:0,2-3,7"), (std::vector<int>{0, 2, 3, 7}));
  EXPECT_EQ(gpus_of("cuda:255"), std::vector<int>{255});

  auto range = ParseDeviceOffer("cuda:2-3");
  auto visible = CudaVisibleDevices(*range, std::nullopt);
  ASSERT_TRUE(visible.ok());
  EXPECT_EQ(**visible, "2,3");
  visible = CudaVisibleDevices(*range, std::string_view("GPU-a,GPU-b,GPU-c,GPU-d"));
  ASSERT_TRUE(visible.ok());
  EXPECT_EQ(**visible, "GPU-c,GPU-d");
  visible = CudaVisibleDevices(*ParseDeviceOffer("cuda:1"), std::string_view("GPU-a,GPU-b"));
  ASSERT_TRUE(visible.ok());
  EXPECT_EQ(**visible, "GPU-b");
  visible = CudaVisibleDevices(*ParseDeviceOffer("cuda:0,3"), std::string_view("4,5,6,7"));
  ASSERT_TRUE(visible.ok());
  EXPECT_EQ(**visible, "4,7");
  // As CUDA reads the variable: spaces around entries ignored, and the
  // first invalid entry (-1) hides itself and every one after it.
  visible = CudaVisibleDevices(*ParseDeviceOffer("cuda:0-1"), std::string_view("4, 5,-1,6"));
  ASSERT_TRUE(visible.ok());
  EXPECT_EQ(**visible, "4,5");
  EXPECT_FALSE(CudaVisibleDevices(*ParseDeviceOffer("cuda:2"), std::string_view("4,5,-1,6")).ok());
  EXPECT_FALSE(CudaVisibleDevices(*ParseDeviceOffer("cuda:0"), std::string_view("")).ok());
  visible = CudaVisibleDevices(*range, std::string_view("5,6"));
  ASSERT_FALSE(visible.ok());
  EXPECT_NE(visible.status().message().find("GPU 2 is not among the 2 GPU(s) that CUDA_VISIBLE_DEVICES='5,6' shows"),
            std::string::npos)
      << visible.status();
  const auto long_offer = ParseDeviceOffer("cuda:" + std::string(4 << 20, ','));
  ASSERT_FALSE(long_offer.ok());
  EXPECT_NE(long_offer.status().message().find("longer than 1024 characters"), std::string::npos)
      << long_offer.status();
  // The master counts what a worker offers with the same parser.
  EXPECT_EQ(ParseDeviceOffer("cuda:0,2-3")->count(), 3);
  for (const char* bad : {"",        "cpu",      "cpu:",       "cpu:0",      "cpu:257",   "cpu:1-2", "cuda:",
                          "cuda:-1", "cuda:4-2", "cuda:0-256", "cuda:256",   "gpu:2",     "cuda:2x", "cuda:1,",
                          "cuda:,1", "cuda:2,1", "cuda:1,1",   "cuda:0-3,2", "cuda:0--1", "cuda: 1"}) {
    const auto offer = ParseDeviceOffer(bad);
    ASSERT_FALSE(offer.ok()) << bad;
    EXPECT_EQ(offer.status().message().rfind(std::string("--devices '") + bad + "': ", 0), 0u) << offer.status();
    EXPECT_NE(offer.status().message().find("(expected cpu:N, cuda:I, cuda:A-B or a list such as cuda:0,2-3)"),
              std::string::npos)
        << offer.status();
  }
}

}  // namespace
}  // namespace tessera::cluster::testing
