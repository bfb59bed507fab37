// Hostile bytes against a real bus endpoint (comm/bus/bus.h), sent from raw
// sockets: the data-plane half of the daemons' fuzz test (the RPC half is
// tests/cluster/fuzz_test.cc).
//
// Node 2 (the target) listens on 127.0.0.1; node 1, a real bus, keeps a link
// to it throughout. Over a thousand cases, all drawn from one seeded
// generator, each carry one fault: a wrong token, a malformed or truncated
// handshake, frames before the handshake, garbage, lengths of 0, 2^31, 2^32-1
// or just over the limit, truncated frames, frames split into 1-byte writes,
// a good prefix then garbage, sessions nobody subscribed, bytes after the bus
// closed, connections reset (SO_LINGER 0), connections that never finish
// their handshake. After each case:
// - the bus closed the connection within kCaseLimit (a refused handshake
//   answered first with a Reject of the right reason);
// - it told why, naming the connection and the problem: to every
//   subscriber's on_error, with the status code, when the peer had stated its
//   node; in its log otherwise (bus.h's contract);
// - good frames before the fault were delivered, byte for byte.
// Every kCheckEvery cases and after each class the link to node 1 still
// carries a frame each way, a new bus can connect and exchange frames, and
// no failure was ever reported about node 1. At the end no descriptor or
// thread is left over. A case that runs longer than kCaseLimit fails the run
// (tests/deadline.h), naming the case.
//
// Replay: the seed is printed; TESSERA_BUS_FUZZ_SEED=S runs seed S, and
// TESSERA_BUS_FUZZ_CASE=i only case i of it (with its batch, for the classes
// that run connections together).

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "comm/bus/bus.h"
#include "core/text.h"
#include "gtest/gtest.h"
#include "spdlog/details/null_mutex.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"
#include "tests/comm/bus_test_support.h"
#include "tests/deadline.h"

namespace tessera::comm::bus {
namespace {

using testing::Clock;
using testing::CountEntries;
using testing::Frame;
using testing::GetU32;
using testing::Header;
using testing::HelloPayload;
using testing::kData;
using testing::kHeaderBytes;
using testing::kHello;
using testing::kHelloAck;
using testing::kHelloFixedBytes;
using testing::kReject;
using testing::kRejectAuth;
using testing::kRejectProtocol;
using testing::kRejectVersion;
using testing::kRejectWrongNode;
using testing::LinkError;
using testing::LocalPort;
using testing::PutU32;
using testing::RawConnect;
using testing::ReadAtLeast;
using testing::Received;
using testing::Recorder;
using testing::WaitClosed;
using testing::WaitFor;
using testing::WaitForMatch;
using testing::WriteAll;

constexpr uint32_t kPeer = 1;              // the real bus linked to the target
constexpr uint32_t kTarget = 2;            // the bus under attack
constexpr uint32_t kFirstFuzzNode = 1000;  // case i claims node kFirstFuzzNode + i
constexpr uint32_t kFirstCheckNode = 100;  // the fresh buses of the serving checks
constexpr char kToken[] = "fuzz-token-2c61f0e9";
constexpr uint64_t kSession = 7;            // subscribed on the target and the peer
constexpr uint32_t kMaxFrame = 256u << 10;  // small, so frames just over it are cheap
constexpr uint64_t kMaxPending = 1u << 20;
constexpr uint32_t kHandshakeLimit = 4096;  // bus.h: a longer frame before the handshake is refused
constexpr double kHandshakeTimeoutS = 0.5;
constexpr auto kCaseLimit = std::chrono::seconds(2);
// Each wait within a case: shorter, so what is missing fails an assertion
// that says so before the case's deadline ends the process.
constexpr auto kStepLimit = std::chrono::seconds(1);
constexpr int kCheckEvery = 25;
constexpr int kCountSlack = 2;  // descriptors and threads at the end vs. the start
// A batch of this many silent connections measures what a stranger's
// connection costs (bus.h: before the handshake "an unauthenticated peer
// cannot make the bus allocate much").
constexpr int kCrowd = 150;
constexpr int64_t kMaxBytesPerStranger = 16 << 10;
// What the process's peak resident memory may grow by over the run. Honest
// buffers stay far below (frames of at most kMaxFrame, kMaxPending held, a
// read buffer per connection; under ASan its quarantine of freed blocks
// too); one buffer sized from a hostile length of 2^31 bytes or more, filled
// as std::vector and std::string fill, goes over.
constexpr int64_t kMaxPeakGrowthBytes = int64_t{1} << 30;
// A slow writer's pause between writes: part of the input, not a wait.
constexpr auto kPace = std::chrono::microseconds(50);
// The silent connections' dribblers send one byte this often.
constexpr auto kDribbleEvery = std::chrono::milliseconds(40);

// --- the input ---

// mt19937_64's output is fixed by the standard, so a seed means the same
// cases everywhere (the std distributions are not, hence the modulo).
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t U64() { return engine_(); }
  uint32_t U32() { return static_cast<uint32_t>(engine_()); }
  uint64_t In(uint64_t lo, uint64_t hi) { return lo + engine_() % (hi - lo + 1); }  // [lo, hi]
  bool OneIn(uint64_t n) { return engine_() % n == 0; }
  std::string Bytes(size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(engine_());
    return s;
  }

 private:
  std::mt19937_64 engine_;
};

enum class Kind {
  kStream,      // one connection at a time
  kSilent,      // a batch of connections that never finish their handshake, open together
  kResetBurst,  // a batch of connections opened together, then all reset
};
enum class End { kHalfClose, kLeaveOpen, kReset };

struct Case {
  int index = 0;
  std::string group;  // the class of fault
  std::string what;   // this case's fault
  Kind kind = Kind::kStream;
  int batch = 0;      // kSilent, kResetBurst: the cases of one batch run together
  uint32_t node = 0;  // the node this case's Hello claims

  std::vector<std::string> writes;  // one send() each (kSilent: the prefix, then bytes to dribble)
  bool pace = false;                // pause kPace after each write
  bool ack_after_first = false;     // read the HelloAck after writes[0], then go on
  End end = End::kHalfClose;
  std::string after_close;  // written once the bus has closed the connection

  // What the bus must do.
  std::optional<uint32_t> reject;            // answer with a Reject of this reason
  std::vector<std::string> says;             // its failure message holds one of these
  std::optional<absl::StatusCode> reported;  // reported to on_error for `node` with this code; else logged
  std::vector<std::string> delivered;        // payloads of kSession frames it delivers, in order
  int held = 0;                              // frames of unsubscribed sessions it takes and holds
  std::vector<uint64_t> held_sessions;       // unsubscribed after the case, dropping what is held

  std::string Describe(uint64_t seed) const {
    std::string bytes;
    for (const std::string& w : writes) bytes += w;
    std::string hex;
    for (size_t i = 0; i < std::min<size_t>(bytes.size(), 48); ++i) {
      static constexpr char kDigits[] = "0123456789abcdef";
      hex += kDigits[static_cast<unsigned char>(bytes[i]) >> 4];
      hex += kDigits[static_cast<unsigned char>(bytes[i]) & 15];
    }
    return StrCat("case ", index, " [", group, "] ", what, "; ", bytes.size(), " bytes in ", writes.size(),
                  " writes: ", hex, bytes.size() > 48 ? "..." : "", " (replay: TESSERA_BUS_FUZZ_SEED=", seed,
                  " TESSERA_BUS_FUZZ_CASE=", index, ")");
  }
};

// Builds the cases, one class after another, from one generator.
class CaseBuilder {
 public:
  explicit CaseBuilder(uint64_t seed) : rng_(seed) {}

  std::vector<Case> Build() {
    WrongToken(100);
    MalformedHello(120);
    BeforeHandshake(60);
    Garbage(150);
    LengthEdges(100);
    Truncated(120);
    SplitWrites(40);
    PrefixThenGarbage(100);
    UnknownSessions(60);
    AfterClose(50);
    ResetLive(50);
    ResetBursts(5, 40);
    Silent({25, 25, 25, kCrowd});
    return std::move(cases_);
  }

 private:
  Case& Add(const std::string& group, std::string what) {
    Case& c = cases_.emplace_back();
    c.index = static_cast<int>(cases_.size()) - 1;
    c.group = group;
    c.what = std::move(what);
    c.node = kFirstFuzzNode + static_cast<uint32_t>(c.index);
    return c;
  }
  // The node the next case will claim (for payloads built before Add).
  uint32_t NextNode() const { return kFirstFuzzNode + static_cast<uint32_t>(cases_.size()); }
  std::string GoodHello(uint32_t node) {
    return Frame(kHello, 0, 0, HelloPayload(node, kTarget, kToken, 1, rng_.U64()));
  }
  // (Each draw is a statement of its own: the order of a call's arguments,
  // or of an operator's operands, is the compiler's to choose.)
  std::string Payload() {
    std::string payload = StrCat("payload ", rng_.U32(), ":");
    return payload + rng_.Bytes(rng_.In(0, 120));
  }
  std::string DataFrame(uint64_t session, const std::string& payload) {
    return Frame(kData, session, rng_.U64(), payload);
  }
  // A good Hello, then `frames` good data frames of kSession: the case's
  // writes, its expected deliveries; the Hello alone first when the case
  // waits for the HelloAck (always, or at random).
  void LivePrefix(Case& c, int frames, bool always_ack = false) {
    c.ack_after_first = always_ack || rng_.OneIn(2);
    std::string bytes = GoodHello(c.node);
    if (c.ack_after_first) {
      c.writes.push_back(std::move(bytes));
      bytes.clear();
    }
    for (int i = 0; i < frames; ++i) {
      c.delivered.push_back(Payload());
      bytes += DataFrame(kSession, c.delivered.back());
    }
    c.writes.push_back(std::move(bytes));
  }
  void AppendToLast(Case& c, const std::string& bytes) {
    if (c.writes.empty()) c.writes.emplace_back();
    c.writes.back() += bytes;
  }
  // bus.h: a failure of a live link, or of a handshake that stated its node.
  static void Reported(Case& c, absl::StatusCode code, std::vector<std::string> says) {
    c.reported = code;
    c.says = std::move(says);
  }
  static void Logged(Case& c, std::vector<std::string> says) { c.says = std::move(says); }
  // Random bytes that cannot start with the magic.
  std::string Noise(size_t n) {
    std::string s = rng_.Bytes(n);
    if (!s.empty() && s[0] == 'T') s[0] = 'X';
    return s;
  }
  // What the bus says about `bytes` of noise followed by our EOF.
  static void ExpectNoise(Case& c, const std::string& bytes) {
    if (bytes.size() >= kHeaderBytes) {
      Logged(c, {"bad frame: magic 0x"});
    } else if (bytes.empty()) {
      Logged(c, {"closed by the peer"});
    } else {
      Logged(c, {StrCat("in the middle of a frame (", bytes.size(), " bytes of it received)")});
    }
  }

  void WrongToken(int n) {
    const std::string token = kToken;
    for (int i = 0; i < n; ++i) {
      std::string guess;
      std::string what;
      switch (rng_.In(0, 7)) {
        case 0:
          what = "empty token";
          break;
        case 1:
          what = "token less its last byte";
          guess = token.substr(0, token.size() - 1);
          break;
        case 2:
          what = "token and one byte more";
          guess = token + static_cast<char>(rng_.U32());
          break;
        case 3: {
          guess = token;
          const size_t at = rng_.In(0, guess.size() - 1);
          guess[at] ^= static_cast<char>(rng_.In(1, 255));
          what = StrCat("token with byte ", at, " changed");
          break;
        }
        case 4:
          guess = rng_.Bytes(token.size());
          what = "random token of the right length";
          break;
        case 5:
          guess = rng_.Bytes(rng_.In(1, 64));
          what = "short random token";
          break;
        case 6:
          guess = rng_.Bytes(rng_.In(65, 1024));
          what = "long random token";
          break;
        default:
          guess = rng_.Bytes(kHandshakeLimit - kHelloFixedBytes);
          what = "token filling the handshake limit exactly";
          break;
      }
      if (guess == token) guess += "!";
      // One in eight claims to be node 1, the peer the target is linked to:
      // a refused stranger must not make that healthy link look failed.
      const bool spoof = rng_.OneIn(8);
      Case& c = Add("wrong token", what + (spoof ? ", claiming the linked peer's node" : ""));
      if (spoof) c.node = kPeer;
      c.writes.push_back(Frame(kHello, 0, 0, HelloPayload(c.node, kTarget, guess, 1, rng_.U64())));
      c.end = End::kLeaveOpen;
      c.reject = kRejectAuth;
      if (spoof) {
        Logged(c, {"authentication failed"});
      } else {
        Reported(c, absl::StatusCode::kPermissionDenied, {"authentication failed"});
      }
    }
  }

  void MalformedHello(int n) {
    for (int i = 0; i < n; ++i) {
      const uint64_t incarnation = rng_.U64();
      switch (rng_.In(0, 6)) {
        case 0: {
          uint32_t version = rng_.OneIn(3) ? (rng_.OneIn(2) ? 0u : 0xffffffffu) : rng_.U32();
          if (version == 1) version = 2;
          Case& c = Add("malformed handshake", StrCat("protocol version ", version));
          c.writes.push_back(Frame(kHello, 0, 0, HelloPayload(c.node, kTarget, kToken, version, incarnation)));
          c.end = End::kLeaveOpen;
          c.reject = kRejectVersion;
          Logged(c, {StrCat("protocol version ", version, " is not supported")});
          break;
        }
        case 1: {
          const size_t size = rng_.In(0, 3);
          Case& c = Add("malformed handshake", StrCat("Hello of ", size, " bytes"));
          c.writes.push_back(Frame(kHello, 0, 0, std::string("\x01\0\0", size)));
          c.end = End::kLeaveOpen;
          c.reject = kRejectProtocol;
          Logged(c, {StrCat("handshake of ", size, " bytes")});
          break;
        }
        case 2: {
          const size_t size = rng_.In(4, kHelloFixedBytes - 1);
          Case& c = Add("malformed handshake", StrCat("version 1 Hello cut to ", size, " bytes"));
          c.writes.push_back(Frame(kHello, 0, 0, HelloPayload(c.node, kTarget, "", 1, incarnation).substr(0, size)));
          c.end = End::kLeaveOpen;
          c.reject = kRejectProtocol;
          Logged(c, {StrCat("handshake of ", size, " bytes")});
          break;
        }
        case 3: {
          const std::string token = rng_.OneIn(2) ? std::string(kToken) : rng_.Bytes(rng_.In(0, 100));
          std::string payload = HelloPayload(NextNode(), kTarget, token, 1, incarnation);
          uint32_t claimed = rng_.OneIn(2) ? static_cast<uint32_t>(token.size() + rng_.In(1, 8))
                                           : (rng_.OneIn(2) ? 0xffffffffu : rng_.U32());
          if (claimed == token.size()) claimed += 1;
          std::string field;
          PutU32(&field, claimed);
          payload.replace(20, 4, field);
          Case& c = Add("malformed handshake", StrCat("token length field ", claimed, " for ", token.size(), " bytes"));
          c.writes.push_back(Frame(kHello, 0, 0, payload));
          c.end = End::kLeaveOpen;
          c.reject = kRejectProtocol;
          Logged(c, {StrCat("token length ", claimed, " does not match its ", token.size(), " bytes")});
          break;
        }
        case 4: {
          uint32_t to = rng_.OneIn(2) ? rng_.U32() : static_cast<uint32_t>(rng_.In(0, 10));
          if (to == kTarget) to = 3;
          Case& c = Add("malformed handshake", StrCat("Hello for node ", to));
          c.writes.push_back(Frame(kHello, 0, 0, HelloPayload(c.node, to, kToken, 1, incarnation)));
          c.end = End::kLeaveOpen;
          c.reject = kRejectWrongNode;
          Reported(c, absl::StatusCode::kFailedPrecondition, {StrCat("asked for node ", to, ", this is node 2")});
          break;
        }
        case 5: {
          Case& c = Add("malformed handshake", "Hello from the target's own node");
          c.node = kTarget;
          c.writes.push_back(Frame(kHello, 0, 0, HelloPayload(kTarget, kTarget, kToken, 1, incarnation)));
          c.end = End::kLeaveOpen;
          c.reject = kRejectWrongNode;
          Reported(c, absl::StatusCode::kFailedPrecondition, {"node 2 asked for node 2"});
          break;
        }
        default: {
          // A protobuf where the Hello belongs: field tags are varints
          // (0x08, 0x12, ...), so its first four bytes are never version 1.
          std::string proto;
          for (int f = static_cast<int>(rng_.In(2, 12)); f > 0; --f) {
            const uint64_t field = rng_.In(1, 15);
            proto += static_cast<char>((field << 3) | (rng_.OneIn(2) ? 0 : 2));
            const std::string value = rng_.Bytes(rng_.In(1, 20));
            proto += static_cast<char>(value.size());
            proto += value;
          }
          Case& c = Add("malformed handshake", StrCat("a protobuf of ", proto.size(), " bytes as the Hello"));
          c.writes.push_back(Frame(kHello, 0, 0, proto));
          c.end = End::kLeaveOpen;
          c.reject = kRejectVersion;
          Logged(c, {"is not supported"});
          break;
        }
      }
    }
  }
  void BeforeHandshake(int n) {
    for (int i = 0; i < n; ++i) {
      const uint32_t type = static_cast<uint32_t>(rng_.In(kHelloAck, kData));
      const std::string payload =
          type == kHelloAck ? HelloPayload(kTarget, NextNode(), kToken) : rng_.Bytes(rng_.In(0, 200));
      Case& c = Add("frames before the handshake", StrCat("a frame of type ", type, " first"));
      c.writes.push_back(Frame(type, type == kData ? kSession : 0, rng_.U64(), payload));
      // Sometimes the Hello follows: out of order is still refused.
      if (rng_.OneIn(2)) c.writes.back() += GoodHello(c.node);
      c.end = End::kLeaveOpen;
      Logged(c, {StrCat("frame of type ", type, " before the handshake")});
    }
  }

  void Garbage(int n) {
    const std::vector<std::string> protocols = {
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/8.5.0\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n",
        "*1\r\n$4\r\nPING\r\n",
        "{\"jsonrpc\":\"2.0\",\"method\":\"Hello\",\"id\":1}\n",
        std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11),  // a TLS ClientHello's start
        std::string(64, '\0'),
        std::string(64, '\xff'),
    };
    for (int i = 0; i < n; ++i) {
      std::string bytes;
      std::string what;
      switch (rng_.In(0, 4)) {
        case 0:
          bytes = Noise(rng_.In(kHeaderBytes, 4000));
          what = "noise";
          break;
        case 1:
          bytes = Noise(rng_.In(0, kHeaderBytes - 1));
          what = "a little noise";
          break;
        case 2: {
          const size_t which = rng_.In(0, protocols.size() - 1);
          bytes = protocols[which];
          if (which == 5) bytes += rng_.Bytes(rng_.In(0, 80));
          what = StrCat("another protocol's greeting (", which, ")");
          break;
        }
        case 3: {
          // Garbage protobufs: what a confused gRPC client might send.
          for (int f = static_cast<int>(rng_.In(1, 30)); f > 0; --f) {
            const uint64_t field = rng_.In(1, 31);
            bytes += static_cast<char>((field << 3) | rng_.In(0, 5));
            bytes += rng_.Bytes(rng_.In(0, 12));
          }
          if (!bytes.empty() && bytes[0] == 'T') bytes[0] = 'X';
          what = "protobuf-like bytes";
          break;
        }
        default: {
          uint32_t type = rng_.U32();
          if (type >= kHello && type <= kData) type = rng_.OneIn(2) ? 0 : 5;
          const uint64_t session = rng_.U64();
          const uint64_t address = rng_.U64();
          bytes = Header(type, session, address, static_cast<uint32_t>(rng_.In(0, 64)));
          bytes += rng_.Bytes(rng_.In(0, 64));
          Case& c = Add("garbage", StrCat("the magic, then unknown type ", type));
          c.writes.push_back(bytes);
          c.end = End::kLeaveOpen;
          Logged(c, {StrCat("unknown type ", type)});
          continue;
        }
      }
      Case& c = Add("garbage", what);
      c.writes.push_back(bytes);
      ExpectNoise(c, bytes);
    }
  }

  void LengthEdges(int n) {
    for (int i = 0; i < n; ++i) {
      const int variant = static_cast<int>(rng_.In(0, 7));
      if (variant <= 2) {  // before the handshake: over the 4 KiB limit
        const std::vector<uint32_t> lengths = {kHandshakeLimit + 1, 0x7fffffffu, 0x80000000u,  0xfffffffeu,
                                               0xffffffffu,         kMaxFrame,   kMaxFrame + 1};
        const uint32_t length = rng_.OneIn(3) ? static_cast<uint32_t>(rng_.In(kHandshakeLimit + 1, 0xffffffffu))
                                              : lengths[rng_.In(0, lengths.size() - 1)];
        const uint32_t type = static_cast<uint32_t>(rng_.In(kHello, kData));
        Case& c = Add("length edges", StrCat("type ", type, " of ", length, " bytes before the handshake"));
        c.writes.push_back(Header(type, 0, 0, length) + rng_.Bytes(rng_.In(0, 64)));
        c.end = End::kLeaveOpen;
        Logged(c, {StrCat(length, " bytes exceed the limit of ", kHandshakeLimit, " before the handshake")});
      } else if (variant == 3) {  // the length read as the u64 all ones
        Case& c = Add("length edges", "length bytes of the u64 maximum before the handshake");
        c.writes.push_back(Header(kHello, 0, 0, 0xffffffffu) + std::string(4, '\xff'));
        c.end = End::kLeaveOpen;
        Logged(c, {"4294967295 bytes exceed the limit"});
      } else if (variant == 4) {  // a Hello of length 0
        Case& c = Add("length edges", "Hello of length 0");
        c.writes.push_back(Header(kHello, 0, 0, 0));
        c.end = End::kLeaveOpen;
        c.reject = kRejectProtocol;
        Logged(c, {"handshake of 0 bytes"});
      } else if (variant == 5) {  // on a live link: over max_frame_bytes
        const std::vector<uint32_t> lengths = {kMaxFrame + 1, 0x80000000u, 0xffffffffu};
        const uint32_t length = rng_.OneIn(2) ? static_cast<uint32_t>(rng_.In(kMaxFrame + 1, 0xffffffffu))
                                              : lengths[rng_.In(0, lengths.size() - 1)];
        Case& c = Add("length edges", StrCat("data frame of ", length, " bytes on a live link"));
        LivePrefix(c, static_cast<int>(rng_.In(0, 2)));
        AppendToLast(c, Header(kData, kSession, 0, length) + rng_.Bytes(rng_.In(0, 64)));
        c.end = End::kLeaveOpen;
        Reported(c, absl::StatusCode::kResourceExhausted,
                 {StrCat(length, " bytes exceed the limit of ", kMaxFrame, " (max_frame_bytes)")});
      } else {  // on a live link: 0 bytes and exactly max_frame_bytes are fine
        const bool full = variant == 7;
        Case& c = Add("length edges", full ? "data frame of exactly max_frame_bytes" : "data frame of 0 bytes");
        LivePrefix(c, 0);
        c.delivered.push_back(full ? rng_.Bytes(kMaxFrame) : std::string());
        AppendToLast(c, Frame(kData, kSession, rng_.U64(), c.delivered.back()));
        Reported(c, absl::StatusCode::kUnavailable, {"closed by the peer"});
      }
    }
  }

  void Truncated(int n) {
    for (int i = 0; i < n; ++i) {
      if (rng_.OneIn(2)) {  // the Hello cut short, then EOF
        Case& c = Add("truncated frames", "");
        const std::string hello = GoodHello(c.node);
        const size_t keep = rng_.In(0, hello.size() - 1);
        c.what = StrCat("Hello cut at ", keep, " of ", hello.size(), " bytes, then EOF");
        c.writes.push_back(hello.substr(0, keep));
        Logged(c, {keep == 0 ? std::string("closed by the peer")
                             : StrCat("in the middle of a frame (", keep, " bytes of it received)")});
      } else {  // a data frame cut short on a live link, then EOF
        Case& c = Add("truncated frames", "");
        LivePrefix(c, static_cast<int>(rng_.In(0, 3)));
        const std::string frame = DataFrame(kSession, Payload());
        const size_t keep = rng_.In(1, frame.size() - 1);
        c.what = StrCat("data frame cut at ", keep, " of ", frame.size(), " bytes on a live link, then EOF");
        AppendToLast(c, frame.substr(0, keep));
        Reported(c, absl::StatusCode::kUnavailable,
                 {StrCat("in the middle of a frame (", keep, " bytes of it received)")});
      }
    }
  }

  void SplitWrites(int n) {
    for (int i = 0; i < n; ++i) {
      const int variant = static_cast<int>(rng_.In(0, 3));
      const size_t chunk = rng_.OneIn(2) ? 1 : rng_.In(2, 7);
      Case& c = Add("split writes", "");
      std::string bytes;
      if (variant <= 1) {
        bytes = GoodHello(c.node);
        for (int f = 0; f < 3; ++f) {
          c.delivered.push_back(Payload());
          bytes += DataFrame(kSession, c.delivered.back());
        }
        c.what = "good Hello and three frames";
        Reported(c, absl::StatusCode::kUnavailable, {"closed by the peer"});
      } else if (variant == 2) {
        bytes = Frame(kHello, 0, 0, HelloPayload(c.node, kTarget, "not the token", 1, rng_.U64()));
        c.what = "Hello with a wrong token";
        c.end = End::kLeaveOpen;
        c.reject = kRejectAuth;
        Reported(c, absl::StatusCode::kPermissionDenied, {"authentication failed"});
      } else {
        bytes = GoodHello(c.node) + Header(kData, kSession, 0, 0xffffffffu);
        c.what = "good Hello, then a frame of 2^32-1 bytes";
        c.end = End::kLeaveOpen;
        Reported(c, absl::StatusCode::kResourceExhausted, {"4294967295 bytes exceed the limit"});
      }
      c.what += StrCat(", written ", chunk, " byte", chunk == 1 ? "" : "s", " at a time");
      for (size_t at = 0; at < bytes.size(); at += chunk) c.writes.push_back(bytes.substr(at, chunk));
      c.pace = true;
    }
  }

  void PrefixThenGarbage(int n) {
    for (int i = 0; i < n; ++i) {
      Case& c = Add("good prefix then garbage", "");
      LivePrefix(c, static_cast<int>(rng_.In(0, 5)));
      c.what = StrCat("good Hello, ", c.delivered.size(), " good frames, then ");
      switch (rng_.In(0, 6)) {
        case 0: {
          const std::string noise = Noise(rng_.In(kHeaderBytes, 2000));
          AppendToLast(c, noise);
          c.what += "noise";
          c.end = End::kLeaveOpen;
          Reported(c, absl::StatusCode::kDataLoss, {"bad frame: magic 0x"});
          break;
        }
        case 1: {
          const std::string noise = Noise(rng_.In(1, kHeaderBytes - 1));
          AppendToLast(c, noise);
          c.what += "a little noise and EOF";
          Reported(c, absl::StatusCode::kUnavailable,
                   {StrCat("in the middle of a frame (", noise.size(), " bytes of it received)")});
          break;
        }
        case 2: {
          uint32_t type = rng_.OneIn(2) ? static_cast<uint32_t>(rng_.In(5, 64)) : rng_.U32();
          if (type >= kHello && type <= kData) type = 0;
          AppendToLast(c, Frame(type, kSession, 0, Payload()));
          c.what += StrCat("a frame of unknown type ", type);
          c.end = End::kLeaveOpen;
          Reported(c, absl::StatusCode::kDataLoss, {StrCat("unknown type ", type)});
          break;
        }
        case 3: {
          const bool ack = rng_.OneIn(2);
          AppendToLast(c, ack ? Frame(kHelloAck, 0, 0, HelloPayload(c.node, kTarget, kToken)) : GoodHello(c.node));
          c.what += ack ? "a HelloAck" : "a second Hello";
          c.end = End::kLeaveOpen;
          Reported(c, absl::StatusCode::kDataLoss, {"a second handshake on a live link"});
          break;
        }
        case 4: {
          std::string reject;
          PutU32(&reject, static_cast<uint32_t>(rng_.In(0, 9)));
          reject += "go away";
          AppendToLast(c, Frame(kReject, 0, 0, reject));
          c.what += "a Reject";
          c.end = End::kLeaveOpen;
          Reported(c, absl::StatusCode::kDataLoss, {"the peer refused the link: go away"});
          break;
        }
        default: {
          std::string frame = Frame(kData, kSession, 1, Payload());
          const uint64_t byte = rng_.In(0, 3);
          frame[byte] ^= static_cast<char>(1 << rng_.In(0, 7));
          AppendToLast(c, frame);
          c.what += "a frame with a bit of its magic flipped";
          c.end = End::kLeaveOpen;
          Reported(c, absl::StatusCode::kDataLoss, {"bad frame: magic 0x"});
          break;
        }
      }
    }
  }

  void UnknownSessions(int n) {
    for (int i = 0; i < n; ++i) {
      Case& c = Add("sessions nobody subscribed", "");
      LivePrefix(c, 0);
      if (i % 10 == 9) {  // more than max_pending_bytes for one session
        const uint64_t session = rng_.U64() | 1u << 20;
        c.held_sessions.push_back(session);
        const std::string big = rng_.Bytes(kMaxFrame);
        for (int f = 0; f < 5; ++f) AppendToLast(c, Frame(kData, session, f, big));
        c.what = StrCat("5 frames of max_frame_bytes for session ", session, " (over max_pending_bytes)");
        c.end = End::kLeaveOpen;
        Reported(c, absl::StatusCode::kResourceExhausted, {StrCat("max_pending_bytes ", kMaxPending)});
        continue;
      }
      const int frames = static_cast<int>(rng_.In(1, 8));
      for (int f = 0; f < frames; ++f) {
        uint64_t session = rng_.OneIn(4) ? (rng_.OneIn(2) ? 0 : ~uint64_t{0}) - f : rng_.U64();
        if (session == kSession) session = 8;
        c.held_sessions.push_back(session);
        const std::string payload = rng_.Bytes(rng_.In(0, 200));
        AppendToLast(c, DataFrame(session, payload));
      }
      c.held = frames;
      c.what = StrCat(frames, " frames for sessions nobody subscribed, then EOF");
      Reported(c, absl::StatusCode::kUnavailable, {"closed by the peer"});
    }
  }

  void AfterClose(int n) {
    for (int i = 0; i < n; ++i) {
      Case& c = Add("bytes after the bus closed", "");
      switch (rng_.In(0, 2)) {
        case 0:
          c.writes.push_back(Frame(kHello, 0, 0, HelloPayload(c.node, kTarget, "wrong", 1, rng_.U64())));
          c.what = "wrong token";
          Reported(c, absl::StatusCode::kPermissionDenied, {"authentication failed"});
          break;
        case 1:
          c.writes.push_back(Noise(rng_.In(kHeaderBytes, 300)));
          c.what = "noise";
          Logged(c, {"bad frame: magic 0x"});
          break;
        default:
          LivePrefix(c, static_cast<int>(rng_.In(0, 2)));
          AppendToLast(c, Header(kData, kSession, 0, kMaxFrame + 1));
          c.what = StrCat("a live link's frame over max_frame_bytes after ", c.delivered.size(), " good ones");
          Reported(c, absl::StatusCode::kResourceExhausted, {"exceed the limit"});
          break;
      }
      c.end = End::kLeaveOpen;
      for (int f = static_cast<int>(rng_.In(1, 20)); f > 0; --f) {
        c.after_close += rng_.OneIn(3) ? Noise(rng_.In(1, 100)) : Frame(kData, kSession, 0, Payload());
      }
      c.what += StrCat(", then ", c.after_close.size(), " bytes more");
    }
  }

  void ResetLive(int n) {
    for (int i = 0; i < n; ++i) {
      Case& c = Add("reset live links", "");
      // The reset comes once the link is live.
      LivePrefix(c, static_cast<int>(rng_.In(0, 3)), /*always_ack=*/true);
      const bool partial = rng_.OneIn(2);
      if (partial) {
        const std::string frame = Frame(kData, kSession, 0, Payload());
        c.writes.back() += frame.substr(0, rng_.In(1, frame.size() - 1));
      }
      c.what =
          StrCat("good Hello, ", c.delivered.size(), " frames", partial ? ", part of one more" : "", ", then a reset");
      c.end = End::kReset;
      Reported(c, absl::StatusCode::kUnavailable, {"reset by peer", "closed by the peer"});
    }
  }

  void ResetBursts(int bursts, int per_burst) {
    for (int b = 0; b < bursts; ++b) {
      for (int i = 0; i < per_burst; ++i) {
        Case& c = Add("reset bursts", "");
        c.kind = Kind::kResetBurst;
        c.batch = b;
        c.end = End::kReset;
        const std::string hello = GoodHello(c.node);
        switch (rng_.In(0, 3)) {
          case 0:
            c.what = "nothing sent";
            break;
          case 1:
            c.writes.push_back(hello.substr(0, rng_.In(1, hello.size() - 1)));
            c.what = "part of a Hello";
            break;
          case 2:
            c.writes.push_back(hello);
            c.what = "a good Hello";
            break;
          default:
            c.writes.push_back(Noise(rng_.In(1, 500)));
            c.what = "noise";
            break;
        }
        c.what += StrCat(", then a reset (one of ", per_burst, " at once)");
      }
    }
  }

  void Silent(const std::vector<int>& batches) {
    for (size_t b = 0; b < batches.size(); ++b) {
      for (int i = 0; i < batches[b]; ++i) {
        Case& c = Add("silent connections", "");
        c.kind = Kind::kSilent;
        c.batch = static_cast<int>(b);
        c.end = End::kLeaveOpen;
        const std::string hello = GoodHello(c.node);
        switch (rng_.In(0, 4)) {
          case 0:
            c.writes = {"", ""};
            c.what = "connects and sends nothing";
            break;
          case 1: {
            const size_t keep = rng_.In(1, kHeaderBytes - 1);
            c.writes = {hello.substr(0, keep), ""};
            c.what = StrCat("sends ", keep, " bytes of a header, then nothing");
            break;
          }
          case 2: {
            const size_t keep = rng_.In(kHeaderBytes, hello.size() - 1);
            c.writes = {hello.substr(0, keep), ""};
            c.what = StrCat("sends ", keep, " of a Hello's ", hello.size(), " bytes, then nothing");
            break;
          }
          case 3:
            c.writes = {Header(kHello, 0, 0, kHandshakeLimit), ""};
            c.what = "announces a Hello of 4096 bytes, sends none";
            break;
          default:
            c.writes = {"", hello};
            c.what = "dribbles a good Hello one byte at a time, too slowly";
            break;
        }
        Logged(c, {StrCat("no handshake within ", kHandshakeTimeoutS, " s")});
      }
    }
  }

  Rng rng_;
  std::vector<Case> cases_;
};

// --- watching the target ---

// True when `text` names the connection from 127.0.0.1:`port` (the bus
// writes "connection from IP:PORT: ..." or "link to node N (IP:PORT)").
bool MentionsPeer(absl::string_view text, int port) {
  const std::string tag = StrCat("127.0.0.1:", port);
  for (size_t at = text.find(tag); at != absl::string_view::npos; at = text.find(tag, at + 1)) {
    const size_t end = at + tag.size();
    if (end < text.size() && (text[end] == ':' || text[end] == ')')) return true;
  }
  return false;
}

bool SaysOneOf(absl::string_view text, const std::vector<std::string>& says) {
  if (says.empty()) return !text.empty();
  for (const std::string& s : says) {
    if (text.find(s) != absl::string_view::npos) return true;
  }
  return false;
}

// The bus logs the failures of connections that never stated their node;
// this sink on spdlog's default logger keeps every line for the test.
class CapturedLog final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 public:
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_.size();
  }
  // The first line from the `from`-th on that `matches`, waiting for it.
  std::optional<std::string> WaitLine(const std::function<bool(const std::string&)>& matches, size_t from,
                                      std::chrono::duration<double> limit) {
    std::unique_lock<std::mutex> lock(mu_);
    return WaitForMatch(lock, cv_, lines_, from, matches, limit);
  }
  int Count(const std::function<bool(const std::string&)>& matches, size_t from) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (size_t i = from; i < lines_.size(); ++i) n += matches(lines_[i]) ? 1 : 0;
    return n;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
    cv_.notify_all();
  }
  void flush_() override {}

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

// A "VmXXX: N kB" line of /proc/self/status, in bytes; -1 if absent.
int64_t MemoryStatus(const char* field) {
  FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return -1;
  const std::string format = StrCat(field, ": %lld kB");
  char line[256];
  int64_t kib = -1;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    long long value = 0;
    if (std::sscanf(line, format.c_str(), &value) == 1) kib = value;
  }
  std::fclose(status);
  return kib < 0 ? -1 : kib * 1024;
}
int64_t PeakResidentBytes() { return MemoryStatus("VmHWM"); }
int64_t ResidentBytes() { return MemoryStatus("VmRSS"); }

void Reset(int fd) {
  linger hard{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  ::close(fd);
}

// Closes a raw socket on every path out of a case.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  void ResetNow() {
    Reset(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// The target, its linked peer, what they saw, and the runners of the cases.
class BusFuzz {
 public:
  explicit BusFuzz(uint64_t seed) : seed_(seed), log_(std::make_shared<CapturedLog>()) {
    previous_logger_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("bus_fuzz", log_));
    target_ = Start(kTarget);
    peer_ = Start(kPeer);
  }
  ~BusFuzz() {
    // The buses log from their threads: they go before the logger does.
    target_.reset();
    peer_.reset();
    spdlog::set_default_logger(previous_logger_);
  }
  BusFuzz(const BusFuzz&) = delete;
  BusFuzz& operator=(const BusFuzz&) = delete;

  void Link() {
    ASSERT_TRUE(target_ && peer_);
    ASSERT_TRUE(on_target_.Subscribe(*target_, kSession).ok());
    ASSERT_TRUE(on_peer_.Subscribe(*peer_, kSession).ok());
    tessera::testing::Deadline deadline(kCaseLimit, "Connect of the peer");
    const absl::Status status = peer_->Connect(kTarget, target_->address());
    ASSERT_TRUE(status.ok()) << status;
  }

  void RunStream(const Case& c) {
    tessera::testing::Deadline deadline(kCaseLimit, c.Describe(seed_));
    const size_t errors_before = on_target_.error_count();
    const size_t log_before = log_->size();
    const size_t frames_before = on_target_.frame_count();
    const int64_t received_before = target_->stats().frames_received;
    Socket socket(RawConnect(target_->address()));
    ASSERT_GE(socket.fd(), 0) << "cannot connect to the target";
    const int port = LocalPort(socket.fd());
    if (c.pace) {
      const int one = 1;
      ::setsockopt(socket.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    std::string reply;
    for (size_t i = 0; i < c.writes.size(); ++i) {
      WriteAll(socket.fd(), c.writes[i]);
      if (c.pace) std::this_thread::sleep_for(kPace);
      if (i == 0 && c.ack_after_first) {
        ASSERT_TRUE(ReadAtLeast(socket.fd(), kHeaderBytes, &reply, kStepLimit)) << "no answer to a good Hello";
        ASSERT_EQ(GetU32(reply, 4), kHelloAck) << "a good Hello answered with frame type " << GetU32(reply, 4);
      }
    }
    // What the case sent before its end arrived first.
    if (!c.delivered.empty()) {
      ASSERT_TRUE(on_target_.WaitFrames(frames_before + c.delivered.size(), kStepLimit))
          << on_target_.frame_count() - frames_before << " of " << c.delivered.size() << " good frames delivered";
    }
    if (c.held > 0) {
      ASSERT_TRUE(WaitFor([&] { return target_->stats().frames_received >= received_before + c.held; }, kStepLimit))
          << "frames of unsubscribed sessions not taken";
    }
    switch (c.end) {
      case End::kHalfClose:
        ::shutdown(socket.fd(), SHUT_WR);
        break;
      case End::kLeaveOpen:
        break;
      case End::kReset:
        socket.ResetNow();
        break;
    }
    if (c.end != End::kReset) {
      ASSERT_TRUE(WaitClosed(socket.fd(), &reply, kStepLimit)) << "the bus left the connection open";
    }
    if (c.reject) ExpectReject(reply, *c.reject);

    // Good frames before the fault, byte for byte; none after it (the
    // connection is closed: nothing of it is left to read). Checked before
    // the round trips below add the peer's frames.
    const auto ours = [&] {
      std::vector<std::string> payloads;
      const std::vector<Received> frames = on_target_.frames();
      for (size_t i = frames_before; i < frames.size(); ++i) {
        if (frames[i].from == c.node) payloads.push_back(frames[i].payload);
      }
      return payloads;
    };
    const std::vector<std::string> delivered = ours();
    ASSERT_EQ(delivered.size(), c.delivered.size()) << "frames delivered";
    for (size_t i = 0; i < c.delivered.size(); ++i) {
      EXPECT_TRUE(delivered[i] == c.delivered[i]) << "payload " << i << " differs";
    }

    // Why, where bus.h says it goes.
    if (c.reported) {
      const std::optional<LinkError> error = on_target_.WaitErrorMatching(
          [&](const LinkError& e) { return e.node == c.node && MentionsPeer(e.status.message(), port); }, errors_before,
          kStepLimit);
      ASSERT_TRUE(error.has_value()) << "no failure of node " << c.node << " (port " << port << ") reported";
      EXPECT_EQ(error->status.code(), *c.reported) << error->status;
      EXPECT_TRUE(SaysOneOf(error->status.message(), c.says))
          << "reported as \"" << error->status.message() << "\", expected one of: " << Join(c.says, " | ");
    } else {
      const std::optional<std::string> line =
          log_->WaitLine([&](const std::string& text) { return MentionsPeer(text, port); }, log_before, kStepLimit);
      ASSERT_TRUE(line.has_value()) << "nothing logged about the connection from port " << port;
      EXPECT_TRUE(SaysOneOf(*line, c.says)) << "logged \"" << *line << "\", expected one of: " << Join(c.says, " | ");
      // And not reported: the peer link's round trip passes through the
      // target's I/O thread after the close did.
      ExpectPeerLinkWorks();
      const std::vector<LinkError> errors = on_target_.errors();
      for (size_t i = errors_before; i < errors.size(); ++i) {
        EXPECT_FALSE(MentionsPeer(errors[i].status.message(), port))
            << "reported to on_error for node " << errors[i].node << ": " << errors[i].status;
      }
    }

    if (!c.after_close.empty()) {
      WriteAll(socket.fd(), c.after_close);
      // The peer link's round trip passes through the target's I/O thread
      // after those bytes did: one failure, still, and nothing delivered.
      ExpectPeerLinkWorks();
      const auto about_us = [&](const std::string& text) { return MentionsPeer(text, port); };
      if (c.reported) {
        int reports = 0;
        const std::vector<LinkError> errors = on_target_.errors();
        for (size_t i = errors_before; i < errors.size(); ++i) {
          reports += MentionsPeer(errors[i].status.message(), port) ? 1 : 0;
        }
        EXPECT_EQ(reports, 1) << "one failure, reported once";
      }
      EXPECT_EQ(log_->Count(about_us, log_before), 1) << "one failure, logged once";
      EXPECT_EQ(ours().size(), c.delivered.size()) << "frames delivered after the close";
    }
    for (uint64_t session : c.held_sessions) target_->Unsubscribe(session);
  }

  // Connections that never finish their handshake, open together: the bus
  // keeps serving while they wait, and closes each at its deadline.
  void RunSilentBatch(const std::vector<const Case*>& batch) {
    const std::string what = StrCat(batch.size(), " silent connections from ", batch.front()->Describe(seed_));
    tessera::testing::Deadline deadline(kCaseLimit * 2, what);
    struct Open {
      const Case* c;
      std::unique_ptr<Socket> socket;
      int port;
      Clock::time_point connected;
      size_t dribbled = 0;
      std::optional<Clock::time_point> closed;
    };
    const size_t log_before = log_->size();
    std::vector<Open> open;
    open.reserve(batch.size());
    const int64_t resident_before = ResidentBytes();
    for (const Case* c : batch) {
      auto socket = std::make_unique<Socket>(RawConnect(target_->address()));
      ASSERT_GE(socket->fd(), 0);
      const int port = LocalPort(socket->fd());
      WriteAll(socket->fd(), c->writes[0]);
      open.push_back(Open{c, std::move(socket), port, Clock::now(), 0, std::nullopt});
    }
    if (batch.size() >= static_cast<size_t>(kCrowd)) {
      // The bus accepts in order: once it has judged one more connection,
      // it holds every silent one.
      ASSERT_TRUE(ExpectGarbageRefused(log_before));
      const int64_t each = (ResidentBytes() - resident_before) / static_cast<int64_t>(batch.size());
      std::printf("a silent connection costs the process about %lld bytes\n", static_cast<long long>(each));
      EXPECT_LT(each, kMaxBytesPerStranger) << "resident memory per silent connection";
    }
    CheckServing(StrCat("while ", batch.size(), " silent connections wait"));
    auto next_dribble = Clock::now();
    for (;;) {
      std::vector<pollfd> polls;
      std::vector<Open*> polled;
      for (Open& o : open) {
        if (o.closed) continue;
        polls.push_back(pollfd{o.socket->fd(), POLLIN, 0});
        polled.push_back(&o);
      }
      if (polls.empty()) break;
      const bool late = std::any_of(polled.begin(), polled.end(),
                                    [](const Open* o) { return Clock::now() - o->connected > kCaseLimit; });
      if (late) break;
      ::poll(polls.data(), polls.size(), static_cast<int>(kDribbleEvery.count() / 4));
      for (size_t i = 0; i < polls.size(); ++i) {
        if (polls[i].revents == 0) continue;
        char buffer[256];
        if (::recv(polls[i].fd, buffer, sizeof(buffer), 0) <= 0) polled[i]->closed = Clock::now();
      }
      if (Clock::now() >= next_dribble) {
        next_dribble = Clock::now() + kDribbleEvery;
        for (Open* o : polled) {
          const std::string& slow = o->c->writes[1];
          if (!o->closed && o->dribbled < slow.size()) WriteAll(o->socket->fd(), slow.substr(o->dribbled++, 1));
        }
      }
    }
    const auto timeout = std::chrono::duration<double>(kHandshakeTimeoutS);
    for (const Open& o : open) {
      SCOPED_TRACE(o.c->Describe(seed_));
      ASSERT_TRUE(o.closed.has_value()) << "a silent connection still open after " << kCaseLimit.count() << " s";
      EXPECT_GE(*o.closed - o.connected, timeout * 0.8) << "closed before its handshake deadline";
      const std::optional<std::string> line =
          log_->WaitLine([&](const std::string& text) { return MentionsPeer(text, o.port); }, log_before, kStepLimit);
      ASSERT_TRUE(line.has_value()) << "nothing logged about the connection from port " << o.port;
      EXPECT_TRUE(SaysOneOf(*line, o.c->says)) << "logged \"" << *line << "\"";
    }
  }

  // One connection of noise, judged: false if the bus did not log its
  // refusal within kStepLimit.
  bool ExpectGarbageRefused(size_t log_from) {
    Socket socket(RawConnect(target_->address()));
    if (socket.fd() < 0) return false;
    const int port = LocalPort(socket.fd());
    WriteAll(socket.fd(), std::string(kHeaderBytes, 'x'));
    return log_->WaitLine([&](const std::string& text) { return MentionsPeer(text, port); }, log_from, kStepLimit)
        .has_value();
  }

  // Connections opened together, some mid-handshake or live, then all reset:
  // no link is left behind and the bus keeps serving.
  void RunResetBurst(const std::vector<const Case*>& batch) {
    const std::string what = StrCat(batch.size(), " resets from ", batch.front()->Describe(seed_));
    tessera::testing::Deadline deadline(kCaseLimit * 2, what);
    std::vector<int> fds;
    for (const Case* c : batch) {
      const int fd = RawConnect(target_->address());
      ASSERT_GE(fd, 0);
      for (const std::string& w : c->writes) WriteAll(fd, w);
      fds.push_back(fd);
    }
    for (int fd : fds) Reset(fd);
    EXPECT_TRUE(WaitFor([&] { return target_->stats().links == 1; }, kStepLimit))
        << target_->stats().links << " links after the resets";
    CheckServing(StrCat("after ", batch.size(), " resets"));
  }

  // The bus still serves: the link to node 1 carries a frame each way, a new
  // bus connects and exchanges a frame each way, and nothing was ever
  // reported about node 1.
  void CheckServing(const std::string& when) {
    SCOPED_TRACE("serving check " + when);
    tessera::testing::Deadline deadline(kCaseLimit, StrCat("serving check ", when, " (seed ", seed_, ")"));
    ExpectPeerLinkWorks();
    const uint32_t node = kFirstCheckNode + static_cast<uint32_t>(checks_++);
    Recorder on_fresh;  // outlives the bus
    std::unique_ptr<Bus> fresh = Start(node);
    ASSERT_TRUE(fresh);
    ASSERT_TRUE(on_fresh.Subscribe(*fresh, kSession).ok());
    const absl::Status connected = fresh->Connect(kTarget, target_->address());
    ASSERT_TRUE(connected.ok()) << connected;
    const size_t at_target = on_target_.frame_count();
    ASSERT_TRUE(fresh->Send(kTarget, kSession, 0, "from a new peer").ok());
    ASSERT_TRUE(on_target_.WaitFrames(at_target + 1, kStepLimit));
    const Received got = on_target_.frames()[at_target];
    EXPECT_EQ(got.from, node);
    EXPECT_EQ(got.payload, "from a new peer");
    ASSERT_TRUE(target_->Send(node, kSession, 0, "back to the new peer").ok());
    ASSERT_TRUE(on_fresh.WaitFrames(1, kStepLimit));
    EXPECT_EQ(on_fresh.frames()[0].payload, "back to the new peer");
    fresh.reset();
    for (const LinkError& e : on_target_.errors()) ASSERT_NE(e.node, kPeer) << e.status;
    for (const LinkError& e : on_peer_.errors()) ADD_FAILURE() << "the peer lost its link: " << e.status;
  }

  void ExpectPeerLinkWorks() {
    const size_t at_target = on_target_.frame_count(), at_peer = on_peer_.frame_count();
    ASSERT_TRUE(peer_->Send(kTarget, kSession, 0, "ping").ok());
    ASSERT_TRUE(target_->Send(kPeer, kSession, 0, "pong").ok());
    ASSERT_TRUE(on_target_.WaitFrames(at_target + 1, kStepLimit)) << "the peer's frame did not arrive";
    ASSERT_TRUE(on_peer_.WaitFrames(at_peer + 1, kStepLimit)) << "the target's frame did not arrive";
    EXPECT_EQ(on_target_.frames()[at_target].from, kPeer);
  }

  Bus& target() { return *target_; }

 private:
  std::unique_ptr<Bus> Start(uint32_t node) {
    BusOptions options;
    options.node = node;
    options.token = kToken;
    options.max_frame_bytes = kMaxFrame;
    options.max_pending_bytes = kMaxPending;
    options.connect_timeout_s = kHandshakeTimeoutS;
    absl::StatusOr<std::unique_ptr<Bus>> bus = Bus::Start(options);
    EXPECT_TRUE(bus.ok()) << bus.status();
    return bus.ok() ? std::move(*bus) : nullptr;
  }

  static void ExpectReject(const std::string& reply, uint32_t reason) {
    for (size_t at = 0; at + kHeaderBytes <= reply.size();) {
      const uint32_t length = GetU32(reply, at + 24);
      if (at + kHeaderBytes + length > reply.size()) break;
      if (GetU32(reply, at + 4) == kReject) {
        ASSERT_GE(length, 4u) << "a Reject without a reason";
        EXPECT_EQ(GetU32(reply, at + kHeaderBytes), reason);
        EXPECT_GT(length, 4u) << "a Reject without a text";
        return;
      }
      at += kHeaderBytes + length;
    }
    ADD_FAILURE() << "no Reject before the close (" << reply.size() << " bytes came back)";
  }

  const uint64_t seed_;
  std::shared_ptr<CapturedLog> log_;
  std::shared_ptr<spdlog::logger> previous_logger_;
  // The recorders outlive the buses: handlers may run until a bus is gone.
  Recorder on_target_, on_peer_;
  std::unique_ptr<Bus> target_, peer_;
  int checks_ = 0;
};

uint64_t SeedFromEnvironment() {
  const char* env = std::getenv("TESSERA_BUS_FUZZ_SEED");
  return env == nullptr ? uint64_t{20250611} : std::strtoull(env, nullptr, 10);
}

TEST(BusFuzzTest, HostileStreamsAreRefusedAndReportedWhileTheBusServes) {
  const uint64_t seed = SeedFromEnvironment();
  const char* only_env = std::getenv("TESSERA_BUS_FUZZ_CASE");
  const int only = only_env == nullptr ? -1 : std::atoi(only_env);
  std::printf("bus data-plane fuzz seed %llu (TESSERA_BUS_FUZZ_SEED=%llu replays it)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  const std::vector<Case> cases = CaseBuilder(seed).Build();
  ASSERT_GE(cases.size(), 1000u);
  if (only >= 0) {
    ASSERT_LT(static_cast<size_t>(only), cases.size()) << "TESSERA_BUS_FUZZ_CASE out of range";
  }

  BusFuzz fuzz(seed);
  fuzz.Link();
  if (::testing::Test::HasFatalFailure()) return;
  fuzz.CheckServing("before the first case");
  const int fds = CountEntries("/proc/self/fd");
  const int threads = CountEntries("/proc/self/task");
  ASSERT_GT(fds, 0);
  const int64_t peak = PeakResidentBytes();
  ASSERT_GT(peak, 0);

  struct Tally {
    int cases = 0;
    double seconds = 0;
  };
  std::map<std::string, Tally> tally;
  std::vector<std::string> order;
  int since_check = 0;
  int64_t max_growth = 0;
  for (size_t i = 0; i < cases.size();) {
    const Case& first = cases[i];
    size_t end = i + 1;
    if (first.kind != Kind::kStream) {
      while (end < cases.size() && cases[end].kind == first.kind && cases[end].batch == first.batch) ++end;
    }
    const bool wanted = only < 0 || (static_cast<size_t>(only) >= i && static_cast<size_t>(only) < end);
    if (wanted) {
      if (tally.find(first.group) == tally.end()) order.push_back(first.group);
      const auto start = Clock::now();
      SCOPED_TRACE(first.Describe(seed));
      if (first.kind == Kind::kStream) {
        fuzz.RunStream(first);
      } else {
        std::vector<const Case*> batch;
        for (size_t k = i; k < end; ++k) batch.push_back(&cases[k]);
        if (first.kind == Kind::kSilent) {
          fuzz.RunSilentBatch(batch);
        } else {
          fuzz.RunResetBurst(batch);
        }
      }
      Tally& t = tally[first.group];
      t.cases += static_cast<int>(end - i);
      t.seconds += std::chrono::duration<double>(Clock::now() - start).count();
      since_check += static_cast<int>(end - i);
      const bool group_ends = end == cases.size() || cases[end].group != first.group;
      if (!::testing::Test::HasFatalFailure() && (since_check >= kCheckEvery || group_ends || only >= 0)) {
        since_check = 0;
        fuzz.CheckServing(StrCat("after case ", end - 1));
        if (group_ends || only >= 0) {
          EXPECT_TRUE(WaitFor([&] { return fuzz.target().stats().links == 1; }, kCaseLimit))
              << fuzz.target().stats().links << " links after [" << first.group << "]; expected the peer's only";
          // No buffer sized from what a hostile header claimed.
          const int64_t growth = PeakResidentBytes() - peak;
          EXPECT_LT(growth, kMaxPeakGrowthBytes)
              << "peak memory grew by " << (growth >> 20) << " MiB by the end of [" << first.group << "]";
          max_growth = std::max(max_growth, growth);
        }
      }
      if (::testing::Test::HasFatalFailure()) {
        std::printf("stopped at %s\n", first.Describe(seed).c_str());
        return;
      }
    }
    i = end;
  }
  std::printf("%-30s %6s %9s\n", "class", "cases", "seconds");
  int total = 0;
  for (const std::string& group : order) {
    std::printf("%-30s %6d %9.2f\n", group.c_str(), tally[group].cases, tally[group].seconds);
    total += tally[group].cases;
  }
  std::printf("%-30s %6d\n", "total", total);
  std::printf("peak resident memory grew by %lld MiB\n", static_cast<long long>(max_growth >> 20));

  fuzz.CheckServing("at the end");
  // A joined thread leaves /proc/self/task a moment after join returns.
  EXPECT_TRUE(WaitFor(
      [&] {
        return std::abs(CountEntries("/proc/self/fd") - fds) <= kCountSlack &&
               std::abs(CountEntries("/proc/self/task") - threads) <= kCountSlack;
      },
      kCaseLimit))
      << "descriptors " << fds << " -> " << CountEntries("/proc/self/fd") << ", threads " << threads << " -> "
      << CountEntries("/proc/self/task");
}

}  // namespace
}  // namespace tessera::comm::bus
