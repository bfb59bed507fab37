// Malformed and out-of-order RPCs against a live master and worker: every
// call gets an answer with a clear status (never a crash, a hang or an
// empty message), and the cluster still runs a job afterwards.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/deadline.h"

namespace tessera::cluster::testing {
namespace {

using std::chrono::seconds;
using tessera::testing::Deadline;

std::string RandomBytes(std::mt19937& rng, size_t max_size) {
  std::uniform_int_distribution<size_t> size(0, max_size);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string bytes(size(rng), '\0');
  for (char& c : bytes) c = static_cast<char>(byte(rng));
  return bytes;
}

// Printable ASCII, odd characters included: ids a client can send.
std::string RandomText(std::mt19937& rng, size_t max_size) {
  std::uniform_int_distribution<size_t> size(0, max_size);
  std::uniform_int_distribution<int> byte(32, 126);
  std::string text(size(rng), ' ');
  for (char& c : text) c = static_cast<char>(byte(rng));
  return text;
}

// Writes raw bytes to the port and reads whatever comes back, within 250 ms.
void SendRawBytes(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  timeval timeout{0, 250000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    (void)!write(fd, bytes.data(), bytes.size());
    char buffer[256];
    (void)!read(fd, buffer, sizeof(buffer));
  }
  close(fd);
}

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
  return port;
}

TEST(ClusterFuzzTest, MalformedAndOutOfOrderRpcsGetClearAnswers) {
  Deadline deadline(seconds(55), "the RPC fuzzer");
  TestCluster cluster;
  cluster.Start({"cpu:1"});
  const std::string worker_id = cluster.workers[0]->worker_id();
  auto master = control::Master::NewStub(MakeChannel(cluster.address, {}));
  auto worker = control::Worker::NewStub(MakeChannel(cluster.worker_addresses[0], {}));
  std::mt19937 rng(20261201);
  int calls = 0;
  std::map<grpc::StatusCode, int> seen;
  // Each call must end within its deadline with one of `allowed` and, when
  // not OK, a message.
  auto check = [&](const std::string& what, const grpc::Status& status, std::set<grpc::StatusCode> allowed) {
    ++calls;
    ++seen[status.error_code()];
    EXPECT_TRUE(allowed.contains(status.error_code()))
        << what << ": " << status.error_code() << " " << status.error_message();
    if (!status.ok()) {
      EXPECT_FALSE(status.error_message().empty()) << what;
    }
  };
  auto context = [](grpc::ClientContext& c) { PrepareContext(c, {}, absl::Seconds(5)); };
  using C = grpc::StatusCode;

  for (int round = 0; round < 60; ++round) {
    {  // random bytes as a config
      grpc::ClientContext c;
      context(c);
      control::SubmitJobRequest r;
      r.set_config_json(RandomBytes(rng, 200));
      if (round % 2) r.add_overrides(RandomBytes(rng, 20));
      control::SubmitJobResponse out;
      check("SubmitJob(random)", master->SubmitJob(&c, r, &out), {C::INVALID_ARGUMENT});
    }
    {  // JSON that is not an object, or with bad values
      grpc::ClientContext c;
      context(c);
      control::SubmitJobRequest r;
      const char* configs[] = {"[]", "1", "\"x\"", R"({"devices_needed": "two"})", R"({"devices_needed": -1})",
                               R"({"devices_needed": 1e300})", R"({"iterations": -5})", "null"};
      r.set_config_json(configs[round % 8]);
      control::SubmitJobResponse out;
      check("SubmitJob(bad)", master->SubmitJob(&c, r, &out), {C::INVALID_ARGUMENT});
    }
    const std::string unknown = round % 3 == 0 ? RandomText(rng, 40) : absl::StrCat("job-", 900000 + round);
    {
      grpc::ClientContext c;
      context(c);
      control::GetJobRequest r;
      r.set_job_id(unknown);
      control::JobInfo out;
      check("GetJob(unknown)", master->GetJob(&c, r, &out), {C::NOT_FOUND});
    }
    {
      grpc::ClientContext c;
      context(c);
      control::CancelJobRequest r;
      r.set_job_id(unknown);
      control::JobInfo out;
      check("CancelJob(unknown)", master->CancelJob(&c, r, &out), {C::NOT_FOUND});
    }
    {
      grpc::ClientContext c;
      context(c);
      control::WatchJobRequest r;
      r.set_job_id(unknown);
      auto reader = master->WatchJob(&c, r);
      control::JobEvent event;
      while (reader->Read(&event)) {
      }
      check("WatchJob(unknown)", reader->Finish(), {C::NOT_FOUND});
    }
    {  // heartbeats and reports from workers the master does not know
      grpc::ClientContext c;
      context(c);
      control::HeartbeatRequest r;
      r.set_worker_id(round % 2 ? RandomText(rng, 30) : worker_id);
      r.set_epoch(round % 2 ? 0 : 1000000 + round);
      r.add_jobs()->set_job_id(RandomText(rng, 10));
      control::HeartbeatResponse out;
      check("Heartbeat(unknown)", master->Heartbeat(&c, r, &out), {C::FAILED_PRECONDITION});
    }
    {
      grpc::ClientContext c;
      context(c);
      control::ReportRequest r;
      r.set_worker_id(RandomText(rng, 30));
      r.set_job_id(unknown);
      r.set_finished(true);
      r.set_code(static_cast<int>(rng()));
      control::ReportResponse out;
      check("Report(unknown)", master->Report(&c, r, &out), {C::FAILED_PRECONDITION});
    }
    {  // metrics of an iteration no job trains (they reached the loss plot)
      grpc::ClientContext c;
      context(c);
      control::ReportRequest r;
      r.set_worker_id(worker_id);
      r.set_job_id(unknown);
      r.add_metrics()->set_iteration(round % 2 ? -1 - static_cast<int64_t>(rng() % 100)
                                               : int64_t{UINT32_MAX} + 1 + static_cast<int64_t>(rng() % 100));
      control::ReportResponse out;
      check("Report(iteration)", master->Report(&c, r, &out), {C::INVALID_ARGUMENT});
    }
    {  // bad registrations
      grpc::ClientContext c;
      context(c);
      control::RegisterWorkerRequest r;
      const char* devices[] = {"", "cpu", ":3", "cpu:0", "cpu:-1", "cpu:99999999999", "cuda:7-2", "cpu:x"};
      r.set_devices(round % 4 == 3 ? RandomText(rng, 20) : devices[round % 8]);
      r.set_worker_address(round % 5 == 0 ? "" : "127.0.0.1:1");
      if (round % 7 == 0) r.set_worker_id("bad id/../x");
      control::RegisterWorkerResponse out;
      check("RegisterWorker(bad)", master->RegisterWorker(&c, r, &out), {C::INVALID_ARGUMENT});
    }
    {  // registrations of a good offer with addresses the worker's flags refuse
      grpc::ClientContext c;
      context(c);
      control::RegisterWorkerRequest r;
      r.set_devices("cpu:1");
      const char* data[] = {"0.0.0.0", "::", "[::]", "10.0.0.1:5000", "bad host\n", "[::1"};
      r.set_worker_address(round % 7 == 6 ? "127.0.0.1:99999" : "127.0.0.1:1");
      r.set_data_address(data[round % 6]);
      control::RegisterWorkerResponse out;
      check("RegisterWorker(addresses)", master->RegisterWorker(&c, r, &out), {C::INVALID_ARGUMENT});
    }
    {  // KV: bad keys, too many keys, negative timeouts
      grpc::ClientContext c;
      context(c);
      control::KvWaitRequest r;
      switch (round % 3) {
        case 0:
          break;  // no keys
        case 1:
          r.add_keys(std::string(2000, 'k'));
          break;
        default:
          r.add_keys("k");
          r.set_timeout_ms(-1);
      }
      control::KvWaitResponse out;
      check("KvWait(bad)", master->KvWait(&c, r, &out), {C::INVALID_ARGUMENT});
    }
    {
      grpc::ClientContext c;
      context(c);
      control::KvGetRequest r;
      r.set_key(round % 2 ? "" : RandomText(rng, 30) + "x");
      control::KvGetResponse out;
      check("KvGet(bad)", master->KvGet(&c, r, &out), {C::INVALID_ARGUMENT, C::NOT_FOUND});
    }
    // The worker service: out-of-order and malformed calls.
    const std::string job = absl::StrCat("fuzz-", round);
    {
      grpc::ClientContext c;
      context(c);
      control::StartRequest r;
      r.set_job_id(job);
      control::StartResponse out;
      check("Start(before LoadPlan)", worker->Start(&c, r, &out), {C::NOT_FOUND});
    }
    {
      grpc::ClientContext c;
      context(c);
      control::LoadPlanRequest r;
      r.set_job_id(job);
      r.set_node(static_cast<uint32_t>(round % 3));
      control::WorkerSlot* slot = r.add_slots();
      slot->set_worker_id(round % 4 == 1 ? "someone-else" : worker_id);
      const bool valid_plan = round % 2 == 0;
      r.set_plan(valid_plan ? R"({"iterations": 1000, "step_ms": 1})" : RandomBytes(rng, 100));
      control::LoadPlanResponse out;
      const grpc::Status loaded = worker->LoadPlan(&c, r, &out);
      check("LoadPlan", loaded, {C::OK, C::INVALID_ARGUMENT});
      if (loaded.ok()) {
        // The master does not know this job, so the worker's next heartbeat
        // may drop it at any point of this sequence: NOT_FOUND (and a fresh
        // LoadPlan) are then the right answers.
        for (int i = 0; i < 2; ++i) {
          grpc::ClientContext s;
          context(s);
          control::StartRequest start;
          start.set_job_id(job);
          control::StartResponse started;
          check(i == 0 ? "Start" : "Start twice", worker->Start(&s, start, &started),
                {i == 0 ? C::OK : C::FAILED_PRECONDITION, C::NOT_FOUND});
        }
        grpc::ClientContext again;
        context(again);
        control::LoadPlanResponse again_out;
        check("LoadPlan twice", worker->LoadPlan(&again, r, &again_out), {C::FAILED_PRECONDITION, C::OK});
        grpc::ClientContext s;
        context(s);
        control::StopRequest stop;
        stop.set_job_id(job);
        control::StopResponse stopped;
        check("Stop", worker->Stop(&s, stop, &stopped), {C::OK, C::NOT_FOUND});
      }
    }
    {
      grpc::ClientContext c;
      context(c);
      control::StopRequest r;
      r.set_job_id(RandomText(rng, 20) + "?");
      control::StopResponse out;
      check("Stop(unknown)", worker->Stop(&c, r, &out), {C::NOT_FOUND});
    }
  }
  {  // oversized fields and messages
    grpc::ClientContext c;
    context(c);
    control::SubmitJobRequest r;
    r.set_config_json(std::string(9 << 20, ' '));
    control::SubmitJobResponse out;
    check("SubmitJob(9 MiB)", master->SubmitJob(&c, r, &out), {C::INVALID_ARGUMENT});
  }
  {
    grpc::ClientContext c;
    context(c);
    control::KvPutRequest r;
    r.set_key("big");
    r.set_value(std::string(17 << 20, 'v'));
    control::KvPutResponse out;
    check("KvPut(17 MiB)", master->KvPut(&c, r, &out), {C::INVALID_ARGUMENT});
  }
  {
    grpc::ClientContext c;
    context(c);
    control::LoadPlanRequest r;
    r.set_job_id("huge");
    r.add_slots()->set_worker_id(worker_id);
    r.set_plan(std::string(kMaxMessageBytes + 16, 'p'));
    control::LoadPlanResponse out;
    check("LoadPlan(> max message)", worker->LoadPlan(&c, r, &out), {C::RESOURCE_EXHAUSTED});
  }
  // Raw bytes to both gRPC ports: HTTP/2 garbage, truncated prefaces.
  for (int i = 0; i < 40; ++i) {
    std::string bytes = RandomBytes(rng, 512);
    if (i % 4 == 0) bytes = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes;
    SendRawBytes(PortOf(i % 2 ? cluster.address : cluster.worker_addresses[0]), bytes);
  }
  EXPECT_GE(calls, 500);
  // Still up, still working.
  auto job = cluster.client->Submit(R"({"iterations": 3})", {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(cluster.WaitEnd(*job).state(), control::SUCCEEDED);
  EXPECT_TRUE(WaitUntil([&] { return cluster.workers[0]->jobs_held() == 0; }))
      << "the fuzzer's jobs were not dropped by the worker";
}

}  // namespace
}  // namespace tessera::cluster::testing
