#pragma once
// An in-process cluster for tests: a master with the FakeJobCompiler, N
// workers with SleepyTestRunners, a client; short heartbeats so failures are
// noticed in a fraction of a second. 127.0.0.1 and OS-picked ports only.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "cluster/client.h"
#include "cluster/master.h"
#include "cluster/worker.h"
#include "gtest/gtest.h"
#include "tests/cluster/test_doubles.h"

namespace tessera::cluster::testing {

// Polls `condition` every 5 ms until it holds (true) or `limit` passes.
inline bool WaitUntil(const std::function<bool()>& condition, absl::Duration limit = absl::Seconds(10)) {
  const absl::Time until = absl::Now() + limit;
  while (!condition()) {
    if (absl::Now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Waits until the job is in a final state (a test failure if not within
// `limit`); returns its last JobInfo.
inline control::JobInfo WaitJobEnd(Client& client, const std::string& job_id, absl::Duration limit) {
  control::JobInfo info;
  const bool ended = WaitUntil(
      [&] {
        auto got = client.Get(job_id);
        if (!got.ok()) return false;
        info = *got;
        return info.state() == control::SUCCEEDED || info.state() == control::FAILED ||
               info.state() == control::CANCELLED;
      },
      limit);
  EXPECT_TRUE(ended) << job_id << " did not end within " << limit << "; state "
                     << control::JobState_Name(info.state());
  return info;
}

inline Master::Options FastMasterOptions() {
  Master::Options options;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.worker_timeout = absl::Seconds(1);
  options.probe_timeout = absl::Milliseconds(300);
  options.probe_failures = 3;
  options.rpc_timeout = absl::Seconds(3);
  return options;
}

inline Worker::Options FastWorkerOptions(const std::string& master, const std::string& devices) {
  Worker::Options options;
  options.master = master;
  options.devices = devices;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.master_timeout = absl::Seconds(1);
  options.rpc_timeout = absl::Seconds(3);
  return options;
}

struct TestCluster {
  std::shared_ptr<RunnerCounters> counters = std::make_shared<RunnerCounters>();
  std::unique_ptr<Master> master;
  std::string address;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::string> worker_addresses;
  std::unique_ptr<Client> client;
  Security security;

  // Starts a master (options' security is used everywhere) and workers with
  // the given devices, and waits for them to register.
  // `client_security`: what workers and the client use towards the master
  // (TLS: its ca); defaults to the master's.
  void Start(const std::vector<std::string>& devices, Master::Options options = FastMasterOptions(),
             const Security* client_security = nullptr) {
    security = client_security != nullptr ? *client_security : options.security;
    master = std::make_unique<Master>(options, std::make_unique<FakeJobCompiler>());
    auto bound = master->Start();
    ASSERT_TRUE(bound.ok()) << bound.status();
    address = *bound;
    for (const std::string& d : devices) AddWorker(d);
    Client::Options client_options;
    client_options.master = address;
    client_options.security = security;
    client = std::make_unique<Client>(client_options);
    ASSERT_TRUE(WaitUntil([&] {
      for (const auto& w : workers) {
        if (!w->registered()) return false;
      }
      return true;
    })) << "workers did not register";
  }

  Worker* AddWorker(const std::string& devices) {
    Worker::Options options = FastWorkerOptions(address, devices);
    options.security = security;
    workers.push_back(std::make_unique<Worker>(options, SleepyRunnerFactory(counters)));
    auto bound = workers.back()->Start();
    EXPECT_TRUE(bound.ok()) << bound.status();
    worker_addresses.push_back(bound.ok() ? *bound : "");
    return workers.back().get();
  }

  control::JobInfo WaitEnd(const std::string& job_id, absl::Duration limit = absl::Seconds(15)) {
    return WaitJobEnd(*client, job_id, limit);
  }

  bool WaitState(const std::string& job_id, control::JobState state, absl::Duration limit = absl::Seconds(10)) {
    return WaitUntil(
        [&] {
          auto got = client->Get(job_id);
          return got.ok() && got->state() == state;
        },
        limit);
  }

  ~TestCluster() {
    for (auto& w : workers) w->Shutdown();
    if (master) master->Shutdown();
  }
};

}  // namespace tessera::cluster::testing
