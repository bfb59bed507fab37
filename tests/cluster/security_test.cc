// The token on every RPC of both services, and TLS.

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/grpc_status.h"
#include "cluster/tls_material.h"
#include "cluster/transport.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
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
// (raw random bytes, a space, a second line, UTF-8). PEM files must hold
// what OpenSSL reads (gRPC logged several lines and failed later,
// elsewhere).
TEST(SecurityTest, TokenAndPemFilesAreCheckedWhenRead) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / absl::StrCat("tessera_secrets_", getpid());
  std::filesystem::create_directories(dir);
  const auto read = [&](const std::string& contents, SecretKind kind) {
    const std::filesystem::path path = dir / "secret";
    std::ofstream(path, std::ios::binary) << contents;
    return ReadSecretFile(path.string(), kind);
  };
  auto good = read("  abc-DEF_123+/=\n\n", SecretKind::kToken);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, "abc-DEF_123+/=");
  for (const std::string& bad : {std::string("ab c"), std::string("abc\ndef"), std::string("p\xc3\xa9ss"),
                                 std::string("x\x01y", 3), std::string("a\0b", 3)}) {
    auto status = read(bad, SecretKind::kToken).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("a token must be printable ASCII without spaces"), std::string::npos) << status;
    EXPECT_NE(status.message().find((dir / "secret").string()), std::string::npos) << status;
  }
  EXPECT_NE(read("hello", SecretKind::kCertificates).status().message().find("holds no PEM block"), std::string::npos);
  // Only regular files: /dev/zero was read without end, a FIFO waited on.
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const SecretKind kind : {SecretKind::kToken, SecretKind::kCertificates, SecretKind::kPrivateKey}) {
    for (const std::string& device : {std::string("/dev/zero"), fifo.string()}) {
      const absl::Status status = ReadSecretFile(device, kind).status();
      EXPECT_NE(status.message().find(device + ": not a regular file"), std::string::npos) << status;
    }
  }
  std::ofstream(dir / "big") << std::string(2 << 20, 'a');
  EXPECT_NE(ReadSecretFile((dir / "big").string(), SecretKind::kToken).status().message().find("more than the"),
            std::string::npos);
  // What OpenSSL cannot read is named with the file (gRPC failed every
  // call with "empty address list"); real material: TlsMaterialIsCheckedWithOpenSsl.
  const std::string cut_short =
      std::string(read("-----BEGIN CERTIFICATE-----\nMAA=\n", SecretKind::kCertificates).status().message());
  EXPECT_NE(cut_short.find((dir / "secret").string() + "': certificate 1 cannot be read (OpenSSL: bad end line)"),
            std::string::npos)
      << cut_short;
  // (A BEGIN line without its dashes: the error stays one line.)
  const std::string torn =
      std::string(read("-----BEGIN CERT\nMAA=\n-----\n", SecretKind::kCertificates).status().message());
  EXPECT_NE(torn.find("holds no CERTIFICATE block"), std::string::npos) << torn;
  EXPECT_EQ(torn.find('\n'), std::string::npos) << torn;
  std::filesystem::remove_all(dir);
}

TEST(SecurityTest, AddressesAreHostAndPortInRange) {
  for (const char* good :
       {"127.0.0.1:7070", "127.0.0.1:0", "localhost:65535", "[::1]:7070", "unix:/tmp/sock", "dns:///example.com:443",
        "127.0.0.1:07070", "127.0.0.1:017170", "127.0.0.1:00000000",  // (leading zeros: decimal, as gRPC)
        "ipv4:127.0.0.1:7070", "ipv4:127.0.0.1:1,127.0.0.2:2", "ipv6:[::1]:7070", "dns://8.8.8.8/example.com:443"}) {
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
      {"127.0.0.1:8\n0", "'127.0.0.1:8\\n0': port '8\\n0' is not a number"},  // (the port said '8 0')
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
      // After a gRPC scheme as a bare one (gRPC took port 99999 for 34463).
      {"dns:///127.0.0.1:99999", "'dns:///127.0.0.1:99999': port 99999 is not in [0, 65535]"},
      {"dns:///127.0.0.1", "no port"},
      {"ipv4:127.0.0.1:abc", "is not a number"},
      {"ipv4:garbage:1", "'garbage' is not an IPv4 address"},
      {"ipv4:127.0.0.1:1,127.0.0.1:70000", "port 70000 is not in"},
      {"ipv6:[zz]:1", "'zz' is not an IPv6 address"},
      {"ipv6:[::1]:-5", "is not a number"},
  };
  for (const auto& [address, error] : bad) {
    const absl::Status status = CheckAddress(address);
    EXPECT_FALSE(status.ok()) << address;
    EXPECT_NE(status.message().find(error), std::string::npos) << address << ": " << status;
  }
}

// A worker registered at an unspecified host (listening on every
// interface) is dialled at the IP its registration came from, the port
// kept; any other address as it is.
TEST(SecurityTest, AnUnspecifiedHostIsDialledAtTheRegistrationsPeer) {
  EXPECT_EQ(DialableAddress("0.0.0.0:7071", "ipv4:10.0.0.5:40312"), "10.0.0.5:7071");
  EXPECT_EQ(DialableAddress("[::]:7071", "ipv6:[fd00::5]:40312"), "[fd00::5]:7071");
  EXPECT_EQ(DialableAddress("[::]:7071", "ipv6:%5Bfd00::5%5D:40312"), "[fd00::5]:7071");
  EXPECT_EQ(DialableAddress("[::]:7071", "ipv4:10.0.0.5:1"), "10.0.0.5:7071");
  EXPECT_EQ(DialableAddress("10.0.0.7:7071", "ipv4:10.0.0.5:40312"), "10.0.0.7:7071");
  EXPECT_EQ(DialableAddress("worker-3:7071", "ipv4:10.0.0.5:40312"), "worker-3:7071");
  EXPECT_EQ(DialableAddress("0.0.0.0:7071", "unix:/tmp/sock"), "0.0.0.0:7071");
  EXPECT_EQ(DialableAddress("0.0.0.0:7071", "ipv4:"), "0.0.0.0:7071");
  EXPECT_EQ(DialableAddress("unix:/tmp/w.sock", "ipv4:10.0.0.5:1"), "unix:/tmp/w.sock");
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

// A worker at `worker_address` registered with the master at `master` by
// a call of this test's (as the worker would, with a device), the master's
// answer.
grpc::Status RegisterByHand(const std::string& master, const Security& security, const std::string& worker_address) {
  auto stub = control::Master::NewStub(MakeChannel(master, security));
  grpc::ClientContext context;
  PrepareContext(context, security, absl::Seconds(5));
  control::RegisterWorkerRequest request;
  request.set_devices("cpu:1");
  request.set_worker_address(worker_address);
  control::RegisterWorkerResponse response;
  return stub->RegisterWorker(&context, request, &response);
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
  options.security.tls_cert = *ReadSecretFile((dir / "cert.pem").string(), SecretKind::kCertificates);
  options.security.tls_key = *ReadSecretFile((dir / "key.pem").string(), SecretKind::kPrivateKey);
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
  // The CA as OpenSSL's "TRUSTED CERTIFICATE" (accepted by the check since
  // gRPC reads it as a certificate): the handshake shows gRPC does.
  const std::string trust =
      absl::StrCat("openssl x509 -in ", (dir / "cert.pem").string(), " -trustout -addtrust serverAuth -out ",
                   (dir / "trusted.pem").string(), " > /dev/null 2>&1");
  ASSERT_EQ(std::system(trust.c_str()), 0) << trust;
  Client::Options trusted;
  trusted.master = cluster.address;
  trusted.security.token = "tls-token";
  auto ca = ReadSecretFile((dir / "trusted.pem").string(), SecretKind::kCaCertificates);
  ASSERT_TRUE(ca.ok()) << ca.status();
  ASSERT_NE(ca->find("BEGIN TRUSTED CERTIFICATE"), std::string::npos);
  trusted.security.tls_ca = *ca;
  trusted.timeout = absl::Seconds(5);
  Client trusted_client(trusted);
  EXPECT_TRUE(trusted_client.List().ok()) << trusted_client.List().status();

  // Workers whose TLS does not match the master's say so at once (they
  // waited 10 s, then quoted OpenSSL's codes, or "Socket closed").
  const auto logged = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);  // (read under its lock)
  const auto saved = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", logged));
  const auto text = [&] { return absl::StrJoin(logged->last_formatted(), ""); };
  const auto said_within = [&](const std::string& line, absl::Duration limit) {
    return WaitUntil([&] { return text().find(line) != std::string::npos; }, limit);
  };
  Worker::Options plain_worker = FastWorkerOptions(cluster.address, "cpu:1");
  plain_worker.security.token = "tls-token";
  {
    Worker worker(plain_worker, SleepyRunnerFactory(std::make_shared<RunnerCounters>()));
    ASSERT_TRUE(worker.Start().ok());
    EXPECT_TRUE(said_within(absl::StrCat("the master at ", cluster.address,
                                         " cannot be reached: the connection was closed (a master serving TLS "
                                         "dialled without --tls-cert/--tls-key/--tls-ca, or one that went away)"),
                            absl::Seconds(3)))
        << text();
    worker.Shutdown();
  }
  Master::Options plain_master = FastMasterOptions();
  plain_master.security.token = "tls-token";
  Master plaintext(plain_master, std::make_unique<FakeJobCompiler>());
  auto plain_address = plaintext.Start();
  ASSERT_TRUE(plain_address.ok()) << plain_address.status();
  Worker::Options tls_worker = FastWorkerOptions(*plain_address, "cpu:1");
  tls_worker.security = options.security;
  {
    Worker worker(tls_worker, SleepyRunnerFactory(std::make_shared<RunnerCounters>()));
    const auto served = worker.Start();
    ASSERT_TRUE(served.ok()) << served.status();
    // The plaintext master's probe of a TLS worker (registered by hand:
    // the worker itself cannot reach it) reads "Socket closed", and is
    // refused as a TLS mismatch (it was taken, and lost for its probes).
    const grpc::Status refused = RegisterByHand(*plain_address, plain_master.security, *served);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
    EXPECT_NE(refused.error_message().find("the master cannot call this worker back at " + *served), std::string::npos)
        << refused.error_message();
    EXPECT_TRUE(said_within(absl::StrCat("the master at ", *plain_address,
                                         " cannot be reached: the TLS handshake failed: it serves no TLS (leave out "
                                         "--tls-cert/--tls-key/--tls-ca)"),
                            absl::Seconds(3)))
        << text();
    worker.Shutdown();
  }
  spdlog::set_default_logger(saved);
  plaintext.Shutdown();
  fs::remove_all(dir);
}

// gRPC's transport text in words, and which of its causes no retry mends.
TEST(SecurityTest, UnreachableCausesInWords) {
  const auto describe = [](absl::Status status, bool tls) { return DescribeUnreachable(status, tls, "--tls-ca"); };
  auto refused =
      describe(absl::UnavailableError("failed to connect to all addresses; last error: UNKNOWN: "
                                      "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused"),
               false);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->why, "nothing listens there (is `tessera master` running at that address?)");
  EXPECT_FALSE(refused->tls_mismatch);
  auto no_tls = describe(absl::UnavailableError("Ssl handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL "
                                                "routines::wrong version number"),
                         true);
  ASSERT_TRUE(no_tls);
  EXPECT_EQ(no_tls->why, "the TLS handshake failed: it serves no TLS (leave out --tls-ca)");
  EXPECT_TRUE(no_tls->tls_mismatch);
  auto closed = describe(absl::UnavailableError("ipv4:127.0.0.1:1: Socket closed"), false);
  ASSERT_TRUE(closed);
  EXPECT_TRUE(closed->tls_mismatch);
  EXPECT_FALSE(describe(absl::UnavailableError("ipv4:127.0.0.1:1: Socket closed"), true))
      << "with TLS, a closed socket is no TLS mismatch";
  auto keepalive = describe(absl::UnavailableError("keepalive watchdog timeout"), false);
  ASSERT_TRUE(keepalive) << "a watch of a stopped master said gRPC's words alone";
  EXPECT_FALSE(keepalive->tls_mismatch);
  EXPECT_FALSE(describe(absl::UnavailableError("master is shutting down"), false)) << "the master's own answer";
  EXPECT_FALSE(describe(absl::InvalidArgumentError("Connection refused"), false)) << "not a transport failure";
}

// A worker the master cannot call back (a token on the worker only) is
// refused at registration, naming why: it was taken, lost for failing the
// master's probes and taken again, for ever, and the jobs placed on it
// failed.
TEST(SecurityTest, AWorkerTheMasterCannotCallBackIsRefusedNamingWhy) {
  Deadline deadline(seconds(20), "a worker the master cannot call");
  Master master(FastMasterOptions(), std::make_unique<FakeJobCompiler>());
  auto bound = master.Start();
  ASSERT_TRUE(bound.ok()) << bound.status();
  Worker::Options options = FastWorkerOptions(*bound, "cpu:1");
  options.security.token = "the-workers-only";
  Worker worker(options, SleepyRunnerFactory(std::make_shared<RunnerCounters>()));
  auto address = worker.Start();
  ASSERT_TRUE(address.ok()) << address.status();
  const grpc::Status refused = RegisterByHand(*bound, Security{}, *address);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  EXPECT_NE(refused.error_message().find("the master cannot call this worker back at " + *address +
                                         " (missing or wrong token"),
            std::string::npos)
      << refused.error_message();
  // Its own registrations are refused likewise: never listed.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Client::Options client_options;
  client_options.master = *bound;
  Client client(client_options);
  auto workers = client.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_TRUE(workers->empty());
  worker.Shutdown();
  master.Shutdown();
}

// Material made here with OpenSSL's API: keys, certificates of any
// validity period, encrypted keys.
struct OpenSslFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
  void operator()(X509* cert) const { X509_free(cert); }
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, OpenSslFree>;

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(size));
}

std::string KeyPem(EVP_PKEY* key, bool encrypted = false) {
  std::unique_ptr<BIO, OpenSslFree> bio(BIO_new(BIO_s_mem()));
  static unsigned char passphrase[] = "passphrase";
  EXPECT_EQ(PEM_write_bio_PrivateKey(bio.get(), key, encrypted ? EVP_aes_256_cbc() : nullptr,
                                     encrypted ? passphrase : nullptr, encrypted ? 10 : 0, nullptr, nullptr),
            1);
  return BioText(bio.get());
}

// A self-signed certificate of `key`, valid from now + `from_s` to now + `to_s`,
// with the subjectAltName `names` ("IP:127.0.0.1"; none when empty).
std::string CertificatePem(EVP_PKEY* key, long from_s = -60, long to_s = 86400, const std::string& names = "") {
  std::unique_ptr<X509, OpenSslFree> cert(X509_new());
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), from_s);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), to_s);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  if (!names.empty()) {
    X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, nullptr, NID_subject_alt_name, names.c_str());
    EXPECT_NE(extension, nullptr);
    X509_add_ext(cert.get(), extension, -1);
    X509_EXTENSION_free(extension);
  }
  EXPECT_GT(X509_sign(cert.get(), key, EVP_sha256()), 0);
  std::unique_ptr<BIO, OpenSslFree> bio(BIO_new(BIO_s_mem()));
  EXPECT_EQ(PEM_write_bio_X509(bio.get(), cert.get()), 1);
  return BioText(bio.get());
}

// The same certificate as OpenSSL's "TRUSTED CERTIFICATE" (`openssl x509
// -trustout`).
std::string TrustedCertificatePem(const std::string& pem) {
  std::unique_ptr<BIO, OpenSslFree> in(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  std::unique_ptr<X509, OpenSslFree> cert(PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr));
  EXPECT_NE(cert, nullptr);
  X509_add1_trust_object(cert.get(), OBJ_nid2obj(NID_server_auth));
  std::unique_ptr<BIO, OpenSslFree> out(BIO_new(BIO_s_mem()));
  EXPECT_EQ(PEM_write_bio_X509_AUX(out.get(), cert.get()), 1);
  return BioText(out.get());
}

// gRPC failed every call ("empty address list") on TLS material it could
// not use: it is refused up front, naming the field and what is wrong.
TEST(SecurityTest, TlsMaterialIsCheckedWithOpenSsl) {
  const KeyPtr rsa(EVP_RSA_gen(2048));
  const KeyPtr ec(EVP_EC_gen("P-256"));
  const KeyPtr other(EVP_EC_gen("P-256"));
  ASSERT_TRUE(rsa && ec && other);
  const std::string rsa_cert = CertificatePem(rsa.get()), ec_cert = CertificatePem(ec.get());
  const auto served = [](const std::string& cert, const std::string& key) {
    Security security;
    security.tls_cert = cert;
    security.tls_key = key;
    security.tls_ca = cert;
    return CheckSecurity(security);
  };
  EXPECT_TRUE(served(rsa_cert, KeyPem(rsa.get())).ok()) << served(rsa_cert, KeyPem(rsa.get()));
  EXPECT_TRUE(served(ec_cert, KeyPem(ec.get())).ok());
  // (`openssl ecparam -genkey` writes the curve's parameters first.)
  EXPECT_TRUE(served(ec_cert, "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n" +
                                  KeyPem(ec.get()))
                  .ok());
  // A certificate with its chain, and a CA bundle, hold several.
  EXPECT_TRUE(served(ec_cert + rsa_cert, KeyPem(ec.get())).ok());
  const std::string pem_cut = rsa_cert.substr(0, rsa_cert.size() / 2);
  const std::vector<std::tuple<std::string, std::string, std::string>> bad = {
      {ec_cert, KeyPem(other.get()),
       "security.tls_cert and security.tls_key: the private key is not the key of the (first) certificate"},
      {rsa_cert, KeyPem(rsa.get(), /*encrypted=*/true),
       "security.tls_key: the private key is encrypted, and gRPC reads keys without a passphrase"},
      {CertificatePem(ec.get(), -2 * 86400, -86400), KeyPem(ec.get()),
       "security.tls_cert and security.tls_key: the certificate expired on 20"},
      {CertificatePem(ec.get(), 86400, 2 * 86400), KeyPem(ec.get()), "the certificate is valid only from 20"},
      {pem_cut, KeyPem(rsa.get()), "security.tls_cert: certificate 1 cannot be read (OpenSSL: bad end line)"},
      {ec_cert + pem_cut, KeyPem(ec.get()), "security.tls_cert: certificate 2 cannot be read"},
      // Well-formed DER that is no certificate (an empty SEQUENCE).
      {"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n", KeyPem(ec.get()),
       "security.tls_cert: certificate 1 cannot be read (OpenSSL: "},
      {KeyPem(ec.get()), KeyPem(ec.get()),
       "security.tls_cert: holds no CERTIFICATE block (a private key's file given for it?)"},
      {ec_cert, ec_cert, "security.tls_key: holds no PRIVATE KEY block (a certificate's file given for it?)"},
      {ec_cert, KeyPem(ec.get()).substr(0, 100), "security.tls_key: its PEM cannot be read (OpenSSL: "},
      {ec_cert, "-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PRIVATE KEY-----\n",
       "security.tls_key: its PRIVATE KEY block is no key OpenSSL can read"},
  };
  for (const auto& [cert, key, error] : bad) {
    const absl::Status status = served(cert, key);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << error;
    EXPECT_NE(status.message().find(error), std::string::npos) << status;
    EXPECT_EQ(status.message().find('\n'), std::string::npos) << status;
  }
  // A certificate without subjectAltName serves, with a note at start:
  // gRPC clients match the address only against those.
  EXPECT_NE(ServedCertificateNote(ec_cert).value_or("").find("the TLS certificate has no subjectAltName"),
            std::string::npos);
  EXPECT_FALSE(ServedCertificateNote(CertificatePem(ec.get(), -60, 86400, "IP:127.0.0.1")).has_value());
  EXPECT_FALSE(ServedCertificateNote("").has_value());
  Security ca_only;
  ca_only.tls_ca = ec_cert + pem_cut;
  EXPECT_NE(CheckSecurity(ca_only).message().find("security.tls_ca: certificate 2 cannot be read"), std::string::npos)
      << CheckSecurity(ca_only);
  // What a peer is verified with must hold one certificate valid now (an
  // expired CA was taken, and every handshake failed later).
  const std::string expired = CertificatePem(ec.get(), -2 * 86400, -86400);
  const std::string coming = CertificatePem(ec.get(), 86400, 2 * 86400);
  const std::vector<std::pair<std::string, std::string>> ca_errors = {
      {expired, "security.tls_ca: its certificate is not valid now: expired on 20"},
      {expired + CertificatePem(rsa.get(), -3 * 86400, -2 * 86400),
       "security.tls_ca: none of its 2 certificates is valid now: the last expired on 20"},
      {expired + coming, "none of its 2 certificates is valid now: expired on 20"},
      {coming, "its certificate is not valid now: valid only from 20"},
  };
  for (const auto& [pem, error] : ca_errors) {
    ca_only.tls_ca = pem;
    EXPECT_NE(CheckSecurity(ca_only).message().find(error), std::string::npos) << CheckSecurity(ca_only);
    EXPECT_EQ(CheckSecurity(ca_only).message().find('\n'), std::string::npos);
  }
  ca_only.tls_ca = expired + ec_cert;
  EXPECT_TRUE(CheckSecurity(ca_only).ok()) << CheckSecurity(ca_only);
  // An OpenSSL "TRUSTED CERTIFICATE" is a certificate to gRPC too.
  ca_only.tls_ca = TrustedCertificatePem(ec_cert);
  ASSERT_NE(ca_only.tls_ca.find("BEGIN TRUSTED CERTIFICATE"), std::string::npos);
  EXPECT_TRUE(CheckSecurity(ca_only).ok()) << CheckSecurity(ca_only);
}

}  // namespace
}  // namespace tessera::cluster::testing
