// The token on every RPC of both services, and TLS.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/grpc_status.h"
#include "cluster/transport.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/deadline.h"

namespace tessera::cluster::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using tessera::testing::Deadline;

// Calls every method of both services with `security`'s token (none when
// empty) and returns their codes, by method name.
std::map<std::string, grpc::StatusCode> CallEverything(const std::string& master, const std::string& worker,
                                                       const Security& security) {
  std::map<std::string, grpc::StatusCode> codes;
  auto master_stub = control::Master::NewStub(MakeChannel(master, security));
  auto worker_stub = control::Worker::NewStub(MakeChannel(worker, security));
  auto call = [&](const std::string& name, auto&& rpc) {
    grpc::ClientContext context;
    PrepareContext(context, security, absl::Seconds(5));
    codes[name] = rpc(context).error_code();
  };
  // Requests that would be valid, so that with the token the answer is
  // about the request (OK, NOT_FOUND), never UNAUTHENTICATED.
  call("RegisterWorker", [&](grpc::ClientContext& c) {
    control::RegisterWorkerRequest r;
    r.set_devices("cpu:1");
    r.set_worker_address("127.0.0.1:1");
    control::RegisterWorkerResponse out;
    return master_stub->RegisterWorker(&c, r, &out);
  });
  call("Heartbeat", [&](grpc::ClientContext& c) {
    control::HeartbeatResponse out;
    return master_stub->Heartbeat(&c, control::HeartbeatRequest(), &out);
  });
  call("Report", [&](grpc::ClientContext& c) {
    control::ReportResponse out;
    return master_stub->Report(&c, control::ReportRequest(), &out);
  });
  call("SubmitJob", [&](grpc::ClientContext& c) {
    control::SubmitJobRequest r;
    r.set_config_json(R"({"devices_needed": 1000})");
    control::SubmitJobResponse out;
    return master_stub->SubmitJob(&c, r, &out);
  });
  call("GetJob", [&](grpc::ClientContext& c) {
    control::JobInfo out;
    return master_stub->GetJob(&c, control::GetJobRequest(), &out);
  });
  call("ListJobs", [&](grpc::ClientContext& c) {
    control::ListJobsResponse out;
    return master_stub->ListJobs(&c, control::ListJobsRequest(), &out);
  });
  call("CancelJob", [&](grpc::ClientContext& c) {
    control::JobInfo out;
    return master_stub->CancelJob(&c, control::CancelJobRequest(), &out);
  });
  call("WatchJob", [&](grpc::ClientContext& c) {
    auto reader = master_stub->WatchJob(&c, control::WatchJobRequest());
    control::JobEvent event;
    while (reader->Read(&event)) {
    }
    return reader->Finish();
  });
  call("ListWorkers", [&](grpc::ClientContext& c) {
    control::ListWorkersResponse out;
    return master_stub->ListWorkers(&c, control::ListWorkersRequest(), &out);
  });
  call("KvPut", [&](grpc::ClientContext& c) {
    control::KvPutRequest r;
    r.set_key("k");
    control::KvPutResponse out;
    return master_stub->KvPut(&c, r, &out);
  });
  call("KvGet", [&](grpc::ClientContext& c) {
    control::KvGetRequest r;
    r.set_key("k");
    control::KvGetResponse out;
    return master_stub->KvGet(&c, r, &out);
  });
  call("KvWait", [&](grpc::ClientContext& c) {
    control::KvWaitRequest r;
    r.add_keys("k");
    control::KvWaitResponse out;
    return master_stub->KvWait(&c, r, &out);
  });
  call("LoadPlan", [&](grpc::ClientContext& c) {
    control::LoadPlanResponse out;
    return worker_stub->LoadPlan(&c, control::LoadPlanRequest(), &out);
  });
  call("Start", [&](grpc::ClientContext& c) {
    control::StartResponse out;
    return worker_stub->Start(&c, control::StartRequest(), &out);
  });
  call("Stop", [&](grpc::ClientContext& c) {
    control::StopResponse out;
    return worker_stub->Stop(&c, control::StopRequest(), &out);
  });
  call("Status", [&](grpc::ClientContext& c) {
    control::WorkerStatusResponse out;
    return worker_stub->Status(&c, control::WorkerStatusRequest(), &out);
  });
  return codes;
}

// A token travels as a header value, which gRPC aborts the process on
// unless it is printable ASCII: such a file is a one-line error naming it
// (raw random bytes, a space, a second line, UTF-8). PEM files must hold a
// PEM block (gRPC logged several lines and failed later, elsewhere).
TEST(SecurityTest, TokenAndPemFilesAreCheckedWhenRead) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / absl::StrCat("tessera_secrets_", getpid());
  std::filesystem::create_directories(dir);
  const auto read = [&](const std::string& contents, bool token) {
    const std::filesystem::path path = dir / "secret";
    std::ofstream(path, std::ios::binary) << contents;
    return ReadSecretFile(path.string(), token);
  };
  auto good = read("  abc-DEF_123+/=\n\n", true);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, "abc-DEF_123+/=");
  for (const std::string& bad : {std::string("ab c"), std::string("abc\ndef"), std::string("p\xc3\xa9ss"),
                                 std::string("x\x01y", 3), std::string("a\0b", 3)}) {
    auto status = read(bad, true).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("a token must be printable ASCII without spaces"), std::string::npos) << status;
    EXPECT_NE(status.message().find((dir / "secret").string()), std::string::npos) << status;
  }
  EXPECT_NE(read("hello", false).status().message().find("holds no PEM block"), std::string::npos);
  // A block cut short or not base64 is named (gRPC failed every call with
  // "empty address list"); real certificates pass (SecurityTest.Tls).
  EXPECT_NE(read("-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n", false)
                .status()
                .message()
                .find("PEM block 1 (CERTIFICATE) does not decode to one whole DER structure (2 bytes): is the file "
                      "cut short?"),
            std::string::npos);
  EXPECT_NE(read("-----BEGIN CERTIFICATE-----\nMIIB*x==\n-----END CERTIFICATE-----\n", false)
                .status()
                .message()
                .find("PEM block 1 (CERTIFICATE) is not base64"),
            std::string::npos);
  EXPECT_NE(read("-----BEGIN CERTIFICATE-----\nMAA=\n", false)
                .status()
                .message()
                .find("PEM block 1 (CERTIFICATE) has no '-----END CERTIFICATE-----'"),
            std::string::npos);
  EXPECT_TRUE(read("-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n", false).ok());  // 30 00
  // (A BEGIN line without its dashes: the error stays one line.)
  const std::string torn = std::string(read("-----BEGIN CERT\nMAA=\n-----\n", false).status().message());
  EXPECT_NE(torn.find("PEM block 1 (CERT\\nMAA=\\n) has no '-----END CERT\\nMAA=\\n-----'"), std::string::npos) << torn;
  EXPECT_EQ(torn.find('\n'), std::string::npos) << torn;
  std::filesystem::remove_all(dir);
}

TEST(SecurityTest, AddressesAreHostAndPortInRange) {
  for (const char* good :
       {"127.0.0.1:7070", "127.0.0.1:0", "localhost:65535", "[::1]:7070", "unix:/tmp/sock", "dns:///example.com:443",
        "127.0.0.1:07070", "127.0.0.1:017170", "127.0.0.1:00000000"}) {  // (leading zeros: decimal, as gRPC)
    EXPECT_TRUE(CheckAddress(good).ok()) << good << ": " << CheckAddress(good);
  }
  EXPECT_TRUE(CheckAddress("10.0.0.2", /*port_required=*/false).ok());
  EXPECT_TRUE(CheckAddress("[::1]", /*port_required=*/false).ok());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"127.0.0.1:99999", "port 99999 is not in [0, 65535]"},
      {"127.0.0.1:065536", "port 65536 is not in [0, 65535]"},
      {"127.0.0.1:1000000", "is not a number in [0, 65535]"},
      {"127.0.0.1", "no port"},
      {"[::1]", "no port"},
      {"", "no host"},
      {":7070", "no host"},
      {"127.0.0.1:", "no port after ':'"},
      {"127.0.0.1:70a", "is not a number"},
      {"127.0.0.1:-1", "is not a number"},
      {"::1:7070", "an IPv6 host goes in brackets"},
      {"[::1:7070", "no ']'"},
      {"[::1]x", "expected HOST:PORT"},
      {"host name:1", "a space"},
      // (gRPC looked "http://127.0.0.1:1" up as a host name.)
      {"http://127.0.0.1:7070",
       "expected HOST:PORT, or a gRPC target (dns:///, unix:, ipv4:, ipv6:), not a 'http://' URL"},
      {"grpc://127.0.0.1:7070", "not a 'grpc://' URL"},
      {"unix:", "'unix:': nothing after 'unix:' (a socket path)"},
      {"dns:///", "'dns:///': nothing after 'dns:' (a host and port)"},
  };
  for (const auto& [address, error] : bad) {
    const absl::Status status = CheckAddress(address);
    EXPECT_FALSE(status.ok()) << address;
    EXPECT_NE(status.message().find(error), std::string::npos) << address << ": " << status;
  }
}

TEST(SecurityTest, EveryMethodOfBothServicesNeedsTheToken) {
  Deadline deadline(seconds(30), "token checks");
  Master::Options options = FastMasterOptions();
  options.security.token = "s3cret-token";
  TestCluster cluster;
  cluster.Start({"cpu:1"}, options);

  // Every method the proto declares, so a new one cannot go unchecked.
  const auto* file = control::RegisterWorkerRequest::descriptor()->file();
  const int methods =
      file->FindServiceByName("Master")->method_count() + file->FindServiceByName("Worker")->method_count();
  for (const std::string& token : {std::string(), std::string("wrong"), std::string("s3cret-token2")}) {
    Security security;
    security.token = token;
    const auto codes = CallEverything(cluster.address, cluster.worker_addresses[0], security);
    EXPECT_EQ(static_cast<int>(codes.size()), methods) << "a method is not covered";
    for (const auto& [method, code] : codes) {
      EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED) << method << " with token '" << token << "'";
    }
  }
  const auto codes = CallEverything(cluster.address, cluster.worker_addresses[0], cluster.security);
  for (const auto& [method, code] : codes) {
    EXPECT_NE(code, grpc::StatusCode::UNAUTHENTICATED) << method;
    EXPECT_NE(code, grpc::StatusCode::UNAVAILABLE) << method;
  }
  EXPECT_EQ(codes.at("ListJobs"), grpc::StatusCode::OK);
  EXPECT_EQ(codes.at("Status"), grpc::StatusCode::OK);
  // With the token, the whole cluster works.
  auto job = cluster.client->Submit(R"({"iterations": 3})", {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(cluster.WaitEnd(*job).state(), control::SUCCEEDED);
}

TEST(SecurityTest, Tls) {
  Deadline deadline(seconds(30), "TLS");
  if (std::system("openssl version > /dev/null 2>&1") != 0) GTEST_SKIP() << "openssl is not installed";
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("tessera_tls_", getpid());
  fs::create_directories(dir);
  // gRPC matches an IP address only against the certificate's
  // subjectAltName, so the self-signed cert carries one.
  const std::string command =
      absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1",
                   " -days 1 -keyout ", (dir / "key.pem").string(), " -out ", (dir / "cert.pem").string(),
                   " > /dev/null 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  Master::Options options = FastMasterOptions();
  options.security.token = "tls-token";
  options.security.tls_cert = *ReadSecretFile((dir / "cert.pem").string(), false);
  options.security.tls_key = *ReadSecretFile((dir / "key.pem").string(), false);
  options.security.tls_ca = options.security.tls_cert;
  TestCluster cluster;
  cluster.Start({"cpu:1"}, options);
  auto job = cluster.client->Submit(R"({"iterations": 3, "rendezvous": true})", {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(cluster.WaitEnd(*job).state(), control::SUCCEEDED);
  // A plaintext client gets nowhere.
  Client::Options plain;
  plain.master = cluster.address;
  plain.security.token = "tls-token";
  plain.timeout = absl::Seconds(2);
  Client plain_client(plain);
  EXPECT_EQ(plain_client.List().status().code(), absl::StatusCode::kUnavailable);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::cluster::testing
