// The actor bus (comm/bus/bus.h): ordering, held frames, auth, bad input from
// raw sockets, lost links, restarts and clean shutdown. Everything runs on
// 127.0.0.1 with ports the OS picks. The wire format comes from
// bus_test_support.h, written from the header's description, so the test
// checks the format, not only that the bus agrees with itself.

#include "comm/bus/bus.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/bus_test_support.h"
#include "tests/deadline.h"

namespace tessera::comm::bus {
namespace {

using ::testing::HasSubstr;
using testing::Clock;
using testing::CountEntries;
using testing::Frame;
using testing::GetU32;
using testing::HelloPayload;
using testing::kData;
using testing::kHello;
using testing::kHelloAck;
using testing::kReject;
using testing::kWait;
using testing::LinkError;
using testing::PutU32;
using testing::RawConnect;
using testing::Received;
using testing::Recorder;
using testing::WaitClosed;
using testing::WaitFor;
using testing::WriteAll;

std::unique_ptr<Bus> StartBus(uint32_t node, const std::function<void(BusOptions&)>& tweak = {}) {
  BusOptions options;
  options.node = node;
  options.token = "secret";
  if (tweak) tweak(options);
  absl::StatusOr<std::unique_ptr<Bus>> bus = Bus::Start(options);
  // Thrown, not returned null: gtest fails the test with the message and
  // goes on to the next, where a null bus would crash the whole binary.
  if (!bus.ok()) {
    throw std::runtime_error("bus node " + std::to_string(node) + " did not start: " + bus.status().ToString());
  }
  return *std::move(bus);
}

// A connection made from raw bytes: `bytes` written, our side shut for
// writing (when `eof`), then closed by the bus.
bool RawStreamIsClosed(const std::string& address, const std::string& bytes, bool eof = true,
                       std::string* received = nullptr) {
  const int fd = RawConnect(address);
  if (fd < 0) return false;
  WriteAll(fd, bytes);
  if (eof) ::shutdown(fd, SHUT_WR);
  const bool closed = WaitClosed(fd, received);
  ::close(fd);
  return closed;
}

// Two connected buses, each with session kSession subscribed (callers wrap it
// in ASSERT_NO_FATAL_FAILURE: a bus that failed to start is null).
constexpr uint64_t kSession = 7;
// The recorders outlive the buses: handlers may run until a bus is gone.
struct Pair {
  Recorder on_a, on_b;
  std::unique_ptr<Bus> a, b;
};
void Link(Pair& p, uint32_t node_a = 1, uint32_t node_b = 2,
          const std::function<void(BusOptions&)>& tweak = {}) {
  p.a = StartBus(node_a, tweak);
  p.b = StartBus(node_b, tweak);
  ASSERT_TRUE(p.a && p.b);
  ASSERT_TRUE(p.on_a.Subscribe(*p.a, kSession).ok());
  ASSERT_TRUE(p.on_b.Subscribe(*p.b, kSession).ok());
  tessera::testing::Deadline deadline(std::chrono::seconds(15), "Connect");
  ASSERT_TRUE(p.a->Connect(node_b, p.b->address()).ok());
}

// The good link still carries a frame each way.
void ExpectLinkWorks(Pair& p, uint64_t session = kSession) {
  const size_t at_a = p.on_a.frame_count(), at_b = p.on_b.frame_count();
  ASSERT_TRUE(p.a->Send(p.b->node(), session, 1000 + at_b, "ping").ok());
  ASSERT_TRUE(p.b->Send(p.a->node(), session, 1000 + at_a, "pong").ok());
  EXPECT_TRUE(p.on_b.WaitFrames(at_b + 1));
  EXPECT_TRUE(p.on_a.WaitFrames(at_a + 1));
}

// --- cases ---

TEST(BusTest, StartReportsItsAddressAndRejectsBadOptions) {
  std::unique_ptr<Bus> bus = StartBus(3);
  ASSERT_TRUE(bus);
  EXPECT_EQ(bus->node(), 3u);
  EXPECT_THAT(bus->address(), HasSubstr("127.0.0.1:"));
  EXPECT_NE(bus->address(), "127.0.0.1:0");

  BusOptions bad;
  bad.listen = "nonsense";
  EXPECT_EQ(Bus::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.listen = "127.0.0.1:0";
  bad.max_frame_bytes = 0;
  EXPECT_EQ(Bus::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);
  BusOptions taken;
  taken.listen = bus->address();
  EXPECT_EQ(Bus::Start(taken).status().code(), absl::StatusCode::kUnavailable);
}

TEST(BusTest, ExchangesManyFramesBothWaysInOrder) {
  constexpr int kFrames = 100000;
  Recorder quiet_a(false), quiet_b(false);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p));
  ASSERT_TRUE(quiet_a.Subscribe(*p.a, 8).ok());
  ASSERT_TRUE(quiet_b.Subscribe(*p.b, 8).ok());
  tessera::testing::Deadline deadline(std::chrono::seconds(30), "100,000 frames each way");
  std::thread b_sends([&] {
    for (int i = 0; i < kFrames; ++i) ASSERT_TRUE(p.b->Send(1, 8, i, "from b").ok());
  });
  for (int i = 0; i < kFrames; ++i) ASSERT_TRUE(p.a->Send(2, 8, i, "from a").ok());
  b_sends.join();
  ASSERT_TRUE(quiet_a.WaitFrames(kFrames, std::chrono::seconds(25)));
  ASSERT_TRUE(quiet_b.WaitFrames(kFrames, std::chrono::seconds(25)));
  EXPECT_TRUE(quiet_a.in_order());
  EXPECT_TRUE(quiet_b.in_order());
  EXPECT_EQ(quiet_b.frames().front().from, 1u);
  const Bus::Stats a = p.a->stats(), b = p.b->stats();
  EXPECT_EQ(a.frames_sent, kFrames);
  EXPECT_EQ(b.frames_received, kFrames);
  EXPECT_EQ(a.bytes_sent, b.bytes_received);
  EXPECT_EQ(a.bytes_sent, kFrames * (28 + 6));
  EXPECT_EQ(a.links, 1);
  EXPECT_EQ(b.links, 1);
}

TEST(BusTest, CarriesPayloadsFromEmptyToMaxFrameBytes) {
  constexpr uint32_t kMax = (3u << 20) + 5;
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p, 1, 2, [](BusOptions& o) { o.max_frame_bytes = kMax; }));
  std::vector<std::string> payloads;
  for (size_t size : {size_t{0}, size_t{1}, size_t{1} << 20, size_t{kMax}}) {
    std::string payload(size, '\0');
    for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>((i * 131 + size) & 0xff);
    payloads.push_back(std::move(payload));
  }
  tessera::testing::Deadline deadline(std::chrono::seconds(20), "payload sizes");
  for (size_t i = 0; i < payloads.size(); ++i) ASSERT_TRUE(p.a->Send(2, kSession, i, payloads[i]).ok());
  const absl::Status too_long = p.a->Send(2, kSession, 9, std::string(kMax + 1, 'x'));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument) << too_long;
  ASSERT_TRUE(p.on_b.WaitFrames(payloads.size()));
  const std::vector<Received> got = p.on_b.frames();
  for (size_t i = 0; i < payloads.size(); ++i) {
    EXPECT_EQ(got[i].address, i);
    EXPECT_EQ(got[i].payload.size(), payloads[i].size());
    EXPECT_TRUE(got[i].payload == payloads[i]) << "payload " << i << " differs";
  }
  ExpectLinkWorks(p);  // the refused Send did not hurt the link
}

TEST(BusTest, HoldsFramesUntilSubscribeThenDeliversInOrder) {
  Recorder later;
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p));
  constexpr uint64_t kLater = 42;
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "held frames");
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(p.a->Send(2, kLater, i, "early " + std::to_string(i)).ok());
  ASSERT_TRUE(WaitFor([&] { return p.b->stats().frames_received == 10; }));
  ASSERT_TRUE(later.Subscribe(*p.b, kLater).ok());
  // Frames sent while the held ones are being delivered queue behind them.
  for (int i = 10; i < 20; ++i) ASSERT_TRUE(p.a->Send(2, kLater, i, "late").ok());
  ASSERT_TRUE(later.WaitFrames(20));
  EXPECT_TRUE(later.in_order());
  EXPECT_EQ(later.frames()[3].payload, "early 3");
  EXPECT_EQ(p.b->Subscribe(kLater, later.OnFrame(), later.OnError()).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(p.b->Subscribe(99, nullptr, later.OnError()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BusTest, PendingBytesBeyondTheLimitFailTheLink) {
  Recorder late;
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p, 1, 2, [](BusOptions& o) { o.max_pending_bytes = 1000; }));
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "pending limit");
  // Once b has closed the link, a's later sends fail: only the limit's
  // worth must have gone.
  int sent = 0;
  while (sent < 20 && p.a->Send(2, 555, sent, std::string(100, 'p')).ok()) ++sent;
  ASSERT_GE(sent, 8);
  const std::optional<LinkError> at_b = p.on_b.WaitError(1);
  ASSERT_TRUE(at_b.has_value());
  EXPECT_EQ(at_b->status.code(), absl::StatusCode::kResourceExhausted) << at_b->status;
  EXPECT_THAT(std::string(at_b->status.message()), HasSubstr("max_pending_bytes"));
  ASSERT_TRUE(p.on_a.WaitError(2).has_value());  // the peer saw the link close
  // What was held within the limit is still delivered.
  ASSERT_TRUE(late.Subscribe(*p.b, 555).ok());
  ASSERT_TRUE(late.WaitFrames(7));
  EXPECT_TRUE(late.in_order());
}

TEST(BusTest, UnsubscribeDiscardsHeldFramesAndDropsLaterOnes) {
  Recorder again;
  std::atomic<int> calls{0};
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p));
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "unsubscribe");
  ASSERT_TRUE(p.a->Send(2, kSession, 0, "seen").ok());
  ASSERT_TRUE(p.on_b.WaitFrames(1));
  p.b->Unsubscribe(kSession);
  for (int i = 1; i <= 5; ++i) ASSERT_TRUE(p.a->Send(2, kSession, i, "dropped").ok());
  // Held frames of a session that never subscribed are discarded too.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(p.a->Send(2, 77, i, "held").ok());
  ASSERT_TRUE(WaitFor([&] { return p.b->stats().frames_received == 9; }));
  p.b->Unsubscribe(77);
  EXPECT_EQ(p.b->stats().frames_dropped, 8);
  EXPECT_EQ(p.on_b.frame_count(), 1u);
  // Unsubscribed from inside its own handler: no further frame reaches it.
  ASSERT_TRUE(p.b->Subscribe(
                     9, [&](uint32_t, uint64_t, std::string_view) {
                       ++calls;
                       p.b->Unsubscribe(9);
                     },
                     [](uint32_t, const absl::Status&) {})
                  .ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.a->Send(2, 9, i, "x").ok());
  ASSERT_TRUE(WaitFor([&] { return p.b->stats().frames_received == 13; }));
  EXPECT_EQ(calls.load(), 1);
  // A session may open again.
  ASSERT_TRUE(again.Subscribe(*p.b, kSession).ok());
  ASSERT_TRUE(p.a->Send(2, kSession, 0, "again").ok());
  EXPECT_TRUE(again.WaitFrames(1));
}

TEST(BusTest, WrongTokenIsRefusedOnBothSides) {
  Recorder on_a, on_b;
  std::unique_ptr<Bus> a = StartBus(1, [](BusOptions& o) { o.token = "alpha"; });
  std::unique_ptr<Bus> b = StartBus(2, [](BusOptions& o) { o.token = "beta"; });
  ASSERT_TRUE(on_a.Subscribe(*a, kSession).ok());
  ASSERT_TRUE(on_b.Subscribe(*b, kSession).ok());
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "wrong token");
  const absl::Status dialled = a->Connect(2, b->address());
  EXPECT_EQ(dialled.code(), absl::StatusCode::kPermissionDenied) << dialled;
  EXPECT_THAT(std::string(dialled.message()), HasSubstr("authentication failed"));
  const std::optional<LinkError> at_b = on_b.WaitError(1);
  ASSERT_TRUE(at_b.has_value());
  EXPECT_EQ(at_b->status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(at_b->status.message()), HasSubstr("authentication failed"));
  const absl::Status back = b->Connect(1, a->address());
  EXPECT_EQ(back.code(), absl::StatusCode::kPermissionDenied) << back;
  EXPECT_EQ(a->stats().links, 0);
  EXPECT_EQ(b->stats().links, 0);
  EXPECT_EQ(a->Send(2, kSession, 0, "x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BusTest, RefusedHelloClaimingALinkedNodeIsNotThatLinksFailure) {
  // Anyone can claim to be node 1: a refused stranger must not make the
  // subscribers of node 2 believe that its healthy link to node 1 failed.
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p));
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "spoofed Hellos");
  std::string reply;
  EXPECT_TRUE(RawStreamIsClosed(p.b->address(), Frame(kHello, 0, 0, HelloPayload(1, 2, "guess")), false, &reply));
  ASSERT_GE(reply.size(), 28u);
  EXPECT_EQ(GetU32(reply, 4), kReject);
  EXPECT_THAT(reply, HasSubstr("authentication failed"));
  EXPECT_TRUE(RawStreamIsClosed(p.b->address(), Frame(kHello, 0, 0, HelloPayload(1, 9, "secret")), false));
  ExpectLinkWorks(p);  // the handlers ran after both refusals
  for (const LinkError& e : p.on_b.errors()) ADD_FAILURE() << "reported: " << e.status;
  // A node without a link is still told about, as before.
  EXPECT_TRUE(RawStreamIsClosed(p.b->address(), Frame(kHello, 0, 0, HelloPayload(3, 2, "guess")), false));
  const std::optional<LinkError> refused = p.on_b.WaitError(3);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status.code(), absl::StatusCode::kPermissionDenied);
}

TEST(BusTest, ConnectorChecksTheAcceptorsToken) {
  // A fake node 2 that answers any Hello with a HelloAck carrying a wrong token.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  std::thread fake([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    char hello[28];
    size_t got = 0;
    while (got < sizeof(hello)) {
      const ssize_t n = ::recv(fd, hello + got, sizeof(hello) - got, 0);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    WriteAll(fd, Frame(kHelloAck, 0, 0, HelloPayload(2, 1, "guess")));
    WaitClosed(fd);
    ::close(fd);
  });
  std::unique_ptr<Bus> a = StartBus(1);
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "fake acceptor");
  const absl::Status status = a->Connect(2, address);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("authentication failed"));
  fake.join();
  ::close(listener);
}

TEST(BusTest, BadStreamsCloseOnlyTheirConnection) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p));
  const std::string at = p.b->address();
  const std::string good_hello = Frame(kHello, 0, 0, HelloPayload(50, 2, "secret"));
  struct Case {
    const char* name;
    std::string bytes;
    bool eof;
  };
  std::string header_only = Frame(kHello, 0, 0, HelloPayload(51, 2, "secret"));
  header_only.resize(28 + 5);  // truncated, then EOF
  const std::vector<Case> cases = {
      {"garbage", std::string("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), false},
      {"truncated then EOF", header_only, true},
      {"oversized length", Frame(kHello, 0, 0, "").substr(0, 24) + std::string("\xff\xff\xff\x7f", 4), false},
      {"wrong magic", Frame(kHello, 0, 0, HelloPayload(52, 2, "secret"), 0xdeadbeef), false},
      {"unknown type", Frame(99, 0, 0, ""), false},
      {"data before the handshake", Frame(kData, kSession, 0, "x"), false},
      {"wrong version", Frame(kHello, 0, 0, HelloPayload(53, 2, "secret", 7)), false},
      {"wrong node", Frame(kHello, 0, 0, HelloPayload(54, 3, "secret")), false},
      {"second handshake", good_hello + Frame(kHello, 0, 0, HelloPayload(50, 2, "secret")), false},
      {"oversized data frame", Frame(kHello, 0, 0, HelloPayload(55, 2, "secret")) +
                                   Frame(kData, kSession, 0, "").substr(0, 24) + std::string("\0\0\0\x10", 4),
       false},
  };
  tessera::testing::Deadline deadline(std::chrono::seconds(30), "bad streams");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string reply;
    EXPECT_TRUE(RawStreamIsClosed(at, c.bytes, c.eof, &reply));
    if (std::string(c.name) == "wrong version") {
      // Told why before the close: a Reject frame naming the version.
      ASSERT_GE(reply.size(), 28u);
      EXPECT_EQ(GetU32(reply, 4), kReject);
      EXPECT_THAT(reply, HasSubstr("protocol version 7"));
    }
    ExpectLinkWorks(p);
  }
  // Failures of connections that named their node reach the subscribers.
  const std::optional<LinkError> second = p.on_b.WaitError(50);
  ASSERT_TRUE(second.has_value());
  EXPECT_THAT(std::string(second->status.message()), HasSubstr("second handshake"));
  const std::optional<LinkError> oversized = p.on_b.WaitError(55);
  ASSERT_TRUE(oversized.has_value());
  EXPECT_EQ(oversized->status.code(), absl::StatusCode::kResourceExhausted);
  for (const LinkError& e : p.on_b.errors()) EXPECT_NE(e.node, 1u) << e.status;
  EXPECT_TRUE(WaitFor([&] { return p.b->stats().links == 1; }));
}

TEST(BusTest, ConnectionWithoutHandshakeIsClosedAfterTheTimeout) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p, 1, 2, [](BusOptions& o) { o.connect_timeout_s = 0.3; }));
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "silent connection");
  const int fd = RawConnect(p.b->address());
  ASSERT_GE(fd, 0);
  const auto start = Clock::now();
  EXPECT_TRUE(WaitClosed(fd, nullptr, std::chrono::seconds(5)));
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(250));
  ::close(fd);
  ExpectLinkWorks(p);
}

TEST(BusTest, FuzzedStreamsLeaveTheBusServing) {
  uint32_t seed = 20240611;
  if (const char* env = std::getenv("TESSERA_BUS_FUZZ_SEED")) seed = static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  std::printf("bus fuzz seed %u (set TESSERA_BUS_FUZZ_SEED to replay)\n", seed);
  std::mt19937 rng(seed);
  auto random_bytes = [&](size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    return s;
  };
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p));
  const std::string at = p.b->address();
  constexpr int kStreams = 320;
  tessera::testing::Deadline deadline(std::chrono::seconds(60), "fuzz loop");
  for (int i = 0; i < kStreams; ++i) {
    std::string bytes;
    const uint32_t fuzz_node = 1000 + static_cast<uint32_t>(i);
    switch (rng() % 4) {
      case 0:  // noise
        bytes = random_bytes(rng() % 200);
        break;
      case 1:  // a plausible header with random fields, then noise
        bytes = Frame(1 + rng() % 5, rng(), rng(), "").substr(0, 24);
        PutU32(&bytes, rng() % 3 == 0 ? rng() : rng() % 64);
        bytes += random_bytes(rng() % 64);
        break;
      case 2: {  // a Hello with flipped bits (never turning into node 1's)
        std::string hello = Frame(kHello, 0, 0, HelloPayload(fuzz_node, 2, "secret", 1, rng()));
        for (int flips = 1 + rng() % 4; flips > 0; --flips) hello[rng() % hello.size()] ^= static_cast<char>(1 << (rng() % 8));
        if (GetU32(hello, 28 + 4) == 1) hello[28 + 4] ^= 0x40;
        bytes = hello;
        break;
      }
      default: {  // a good Hello, then data frames with flipped bits and noise
        bytes = Frame(kHello, 0, 0, HelloPayload(fuzz_node, 2, "secret", 1, rng()));
        std::string frames;
        for (int f = rng() % 5; f > 0; --f) frames += Frame(kData, rng() % 4, rng(), random_bytes(rng() % 40));
        for (int flips = rng() % 4; flips > 0 && !frames.empty(); --flips) {
          frames[rng() % frames.size()] ^= static_cast<char>(1 << (rng() % 8));
        }
        bytes += frames + random_bytes(rng() % 16);
        break;
      }
    }
    ASSERT_TRUE(RawStreamIsClosed(at, bytes)) << "stream " << i << " (seed " << seed << ") left open";
  }
  ExpectLinkWorks(p);
  EXPECT_TRUE(WaitFor([&] { return p.b->stats().links == 1; }));
  for (const LinkError& e : p.on_b.errors()) EXPECT_NE(e.node, 1u) << e.status;
}

TEST(BusTest, SendWithoutALinkIsAnError) {
  std::unique_ptr<Bus> a = StartBus(1);
  const absl::Status unknown = a->Send(9, kSession, 0, "x");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("node 9"));
  EXPECT_FALSE(a->Send(1, kSession, 0, "x").ok());
  tessera::testing::Deadline deadline(std::chrono::seconds(15), "bad Connects");
  EXPECT_EQ(a->Connect(2, "no-port").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Connect(1, a->address()).code(), absl::StatusCode::kInvalidArgument);
  // A port nobody listens on: that of a bus that is gone.
  std::string gone = StartBus(2)->address();
  const absl::Status refused = a->Connect(2, gone);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  // A listener that never answers the handshake.
  std::unique_ptr<Bus> slow = StartBus(1, [](BusOptions& o) { o.connect_timeout_s = 0.3; });
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const absl::Status silent = slow->Connect(2, "127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  EXPECT_EQ(silent.code(), absl::StatusCode::kDeadlineExceeded) << silent;
  ::close(listener);
}

TEST(BusTest, LostLinkIsReportedWithinOneSecond) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p));
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "lost links");
  // The peer bus destroyed.
  const auto destroyed = Clock::now();
  p.b.reset();
  const std::optional<LinkError> lost = p.on_a.WaitError(2, std::chrono::seconds(1));
  ASSERT_TRUE(lost.has_value()) << "no error within 1 s";
  EXPECT_LE(lost->at - destroyed, std::chrono::seconds(1));
  EXPECT_EQ(lost->status.code(), absl::StatusCode::kUnavailable);
  const absl::Status after = p.a->Send(2, kSession, 0, "x");
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
  EXPECT_THAT(std::string(after.message()), HasSubstr("node 2"));
  EXPECT_EQ(p.on_a.errors().size(), 1u);  // once per failure

  // A peer that dies: its socket reset by the kernel.
  const int fd = RawConnect(p.a->address());
  ASSERT_GE(fd, 0);
  WriteAll(fd, Frame(kHello, 0, 0, HelloPayload(3, 1, "secret")));
  ASSERT_TRUE(WaitFor([&] { return p.a->stats().links == 1; }));
  linger hard{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  const auto died = Clock::now();
  ::close(fd);
  const std::optional<LinkError> reset = p.on_a.WaitError(3, std::chrono::seconds(1));
  ASSERT_TRUE(reset.has_value()) << "no error within 1 s";
  EXPECT_LE(reset->at - died, std::chrono::seconds(1));

  // The peer's Disconnect: reported there, not here.
  Pair q;
  ASSERT_NO_FATAL_FAILURE(Link(q, 4, 5));
  q.b->Disconnect(4);
  EXPECT_EQ(q.b->Send(4, kSession, 0, "x").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(q.on_a.WaitError(5, std::chrono::seconds(1)).has_value());
  EXPECT_TRUE(q.on_b.errors().empty());
}

TEST(BusTest, ReconnectsAfterThePeerRestarts) {
  std::vector<std::unique_ptr<Recorder>> restarted;  // one per incarnation of node 2, outliving it
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p));
  tessera::testing::Deadline deadline(std::chrono::seconds(20), "restarts");
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    const size_t errors = p.on_a.errors().size();
    p.b.reset();
    ASSERT_TRUE(WaitFor([&] { return p.on_a.errors().size() > errors; }));
    p.b = StartBus(2);
    Recorder& on_b = *restarted.emplace_back(std::make_unique<Recorder>());
    ASSERT_TRUE(on_b.Subscribe(*p.b, kSession).ok());
    // Alternate who dials.
    const absl::Status status = round % 2 == 0 ? p.b->Connect(1, p.a->address()) : p.a->Connect(2, p.b->address());
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(p.a->Send(2, kSession, 0, "again").ok());
    ASSERT_TRUE(on_b.WaitFrames(1));
    ASSERT_TRUE(p.b->Send(1, kSession, round, "back").ok());
    ASSERT_TRUE(p.on_a.WaitFrames(static_cast<size_t>(round) + 1));
  }
  EXPECT_TRUE(p.on_a.in_order());
}

TEST(BusTest, ConnectRightAfterDisconnectOpensANewLink) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Link(p));
  tessera::testing::Deadline deadline(std::chrono::seconds(20), "disconnect and reconnect");
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(round);
    p.a->Disconnect(2);
    // B may not have seen the old link close yet; Connect gets through anyway.
    const absl::Status status = p.a->Connect(2, p.b->address());
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(p.a->Send(2, kSession, round, "after").ok());
    ASSERT_TRUE(p.on_b.WaitFrames(static_cast<size_t>(round) + 1));
  }
  EXPECT_TRUE(p.on_b.in_order());
  EXPECT_TRUE(p.on_a.errors().empty());  // our own Disconnects are not failures here
  EXPECT_EQ(p.a->stats().links, 1);
}

TEST(BusTest, SimultaneousConnectsShareOneLink) {
  tessera::testing::Deadline deadline(std::chrono::seconds(30), "simultaneous connects");
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(round);
    Pair p;
    p.a = StartBus(1);
    p.b = StartBus(2);
    ASSERT_TRUE(p.on_a.Subscribe(*p.a, kSession).ok());
    ASSERT_TRUE(p.on_b.Subscribe(*p.b, kSession).ok());
    absl::Status from_b;
    std::thread dial([&] { from_b = p.b->Connect(1, p.a->address()); });
    const absl::Status from_a = p.a->Connect(2, p.b->address());
    dial.join();
    ASSERT_TRUE(from_a.ok()) << from_a;
    ASSERT_TRUE(from_b.ok()) << from_b;
    ASSERT_TRUE(WaitFor([&] { return p.a->stats().links == 1 && p.b->stats().links == 1; }));
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(p.a->Send(2, kSession, i, "a").ok());
      ASSERT_TRUE(p.b->Send(1, kSession, i, "b").ok());
    }
    ASSERT_TRUE(p.on_b.WaitFrames(50));
    ASSERT_TRUE(p.on_a.WaitFrames(50));
    EXPECT_TRUE(p.on_a.in_order());
    EXPECT_TRUE(p.on_b.in_order());
    EXPECT_TRUE(p.on_a.errors().empty());
    // Connect again reuses the link.
    ASSERT_TRUE(p.a->Connect(2, p.b->address()).ok());
    EXPECT_EQ(p.a->stats().links, 1);
  }
}

TEST(BusTest, FiftyStartStopCyclesLeakNoDescriptorsOrThreads) {
  // Warm up whatever the first bus sets up once per process.
  {
    Pair warm;
    ASSERT_NO_FATAL_FAILURE(Link(warm));
    ExpectLinkWorks(warm);
  }
  // The warm-up's joined threads leave /proc/self/task a moment after join
  // returns: the baseline is taken once the counts have held still for 200 ms
  // (CI once caught one of them there and saw "threads 2 -> 1").
  int fds = CountEntries("/proc/self/fd");
  int threads = CountEntries("/proc/self/task");
  for (int still = 0; still < 4;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int now_fds = CountEntries("/proc/self/fd");
    const int now_threads = CountEntries("/proc/self/task");
    still = now_fds == fds && now_threads == threads ? still + 1 : 0;
    fds = now_fds;
    threads = now_threads;
  }
  ASSERT_GT(fds, 0);
  {
    tessera::testing::Deadline deadline(std::chrono::seconds(40), "50 cycles");
    for (int i = 0; i < 50; ++i) {
      Pair p;
      ASSERT_NO_FATAL_FAILURE(Link(p));
      ExpectLinkWorks(p);
    }
  }
  // A joined thread leaves /proc/self/task a moment after join returns.
  // At most the baseline: a leak would be one per cycle, 50 at least.
  EXPECT_TRUE(WaitFor([&] {
    return CountEntries("/proc/self/fd") <= fds && CountEntries("/proc/self/task") <= threads;
  })) << "fds "
      << fds << " -> " << CountEntries("/proc/self/fd") << ", threads " << threads << " -> "
      << CountEntries("/proc/self/task");
}

}  // namespace
}  // namespace tessera::comm::bus
