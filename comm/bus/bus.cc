#include "comm/bus/bus.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_join.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/write.hpp"
#include "core/logging.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::comm::bus {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;

// Wire constants. Changing the layout of any frame means a new version.
constexpr uint32_t kMagic = 0x31425354;  // the bytes "TSB1" read little-endian
constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kHeaderBytes = 28;  // magic u32, type u32, session u64, address u64, length u32
// Until a peer has proved it knows the token, its frames stay small.
constexpr uint32_t kMaxHandshakeBytes = 4096;
constexpr size_t kMaxTokenBytes = 1024;
constexpr size_t kReadChunk = 64 << 10;
// A read buffer grown for a large frame is given back once it is empty.
constexpr size_t kKeptBufferBytes = 4 << 20;

enum class FrameType : uint32_t { kHello = 1, kHelloAck = 2, kReject = 3, kData = 4 };
enum class RejectReason : uint32_t { kAuth = 1, kVersion = 2, kWrongNode = 3, kDuplicate = 4, kProtocol = 5 };

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

struct Header {
  uint32_t magic;
  uint32_t type;
  uint64_t session;
  uint64_t address;
  uint32_t length;
};

Header ParseHeader(const char* p) {
  return Header{GetU32(p), GetU32(p + 4), GetU64(p + 8), GetU64(p + 16), GetU32(p + 24)};
}

void AppendFrame(std::string* out, FrameType type, uint64_t session, uint64_t address, std::string_view payload) {
  out->reserve(out->size() + kHeaderBytes + payload.size());
  PutU32(out, kMagic);
  PutU32(out, static_cast<uint32_t>(type));
  PutU64(out, session);
  PutU64(out, address);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out->append(payload.data(), payload.size());
}

// Hello and HelloAck payload: version u32 | from u32 | to u32 | incarnation u64
// | token length u32 | token.
struct Hello {
  uint32_t version = 0;
  uint32_t from = 0;
  uint32_t to = 0;
  uint64_t incarnation = 0;
  std::string token;
};
constexpr size_t kHelloFixedBytes = 24;

std::string EncodeHello(const Hello& hello) {
  std::string out;
  PutU32(&out, hello.version);
  PutU32(&out, hello.from);
  PutU32(&out, hello.to);
  PutU64(&out, hello.incarnation);
  PutU32(&out, static_cast<uint32_t>(hello.token.size()));
  out += hello.token;
  return out;
}

// The version is read first, so a peer of another version is told so even if
// the rest of its Hello has another layout.
absl::StatusOr<Hello> DecodeHello(std::string_view payload) {
  Hello hello;
  if (payload.size() < 4) return absl::InvalidArgumentError(StrCat("handshake of ", payload.size(), " bytes"));
  hello.version = GetU32(payload.data());
  if (hello.version != kProtocolVersion) return hello;
  if (payload.size() < kHelloFixedBytes) {
    return absl::InvalidArgumentError(StrCat("handshake of ", payload.size(), " bytes"));
  }
  hello.from = GetU32(payload.data() + 4);
  hello.to = GetU32(payload.data() + 8);
  hello.incarnation = GetU64(payload.data() + 12);
  const uint32_t token_bytes = GetU32(payload.data() + 20);
  if (token_bytes != payload.size() - kHelloFixedBytes) {
    return absl::InvalidArgumentError(StrCat("handshake token length ", token_bytes, " does not match its ",
                                             payload.size() - kHelloFixedBytes, " bytes"));
  }
  hello.token.assign(payload.data() + kHelloFixedBytes, token_bytes);
  return hello;
}

// Time depends on the length of our own token only, never on where a guess
// differs from it.
bool TokensEqual(std::string_view expected, std::string_view got) {
  unsigned diff = expected.size() != got.size() ? 1u : 0u;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < got.size() ? static_cast<unsigned char>(got[i]) : 0;
    diff |= static_cast<unsigned char>(expected[i]) ^ g;
  }
  return diff == 0;
}

std::string EndpointText(const tcp::endpoint& endpoint) {
  const asio::ip::address address = endpoint.address();
  return address.is_v6() ? StrCat("[", address.to_string(), "]:", endpoint.port())
                         : StrCat(address.to_string(), ":", endpoint.port());
}

// "host:port" (host an IP literal, IPv6 in brackets; with `resolve`, also a
// name, looked up in the calling thread).
absl::StatusOr<tcp::endpoint> ParseEndpoint(const std::string& text, bool resolve) {
  const size_t colon = text.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || !ParseInteger(std::string_view(text).substr(colon + 1), &port) ||
      port > 65535) {
    return absl::InvalidArgumentError(StrCat("bad address '", text, "': expected host:port"));
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  ErrorCode ec;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (!ec) return tcp::endpoint(address, static_cast<uint16_t>(port));
  if (!resolve) return absl::InvalidArgumentError(StrCat("bad address '", text, "': host is not an IP address"));
  asio::io_context io;
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    return absl::InvalidArgumentError(StrCat("cannot resolve '", text, "': ", ec ? ec.message() : "no address"));
  }
  return results.begin()->endpoint();
}

// One TCP connection: handshaking, then (once registered) the live link to
// its node. Everything but the send queue is touched on the I/O thread only.
struct Connection {
  enum class State { kHandshaking, kLive, kClosed };

  Connection(tcp::socket s, bool is_outgoing)
      : socket(std::move(s)), timer(socket.get_executor()), outgoing(is_outgoing) {}

  tcp::socket socket;
  asio::steady_timer timer;  // handshake deadline, then the deadline of a closing flush
  const bool outgoing;
  std::string peer;  // remote "ip:port", for messages

  State state = State::kHandshaking;
  bool node_known = false;  // `node` is what the peer stated (incoming) or what we dialled (outgoing)
  uint32_t node = 0;
  uint32_t initiator = 0;  // the node that opened the connection
  uint64_t peer_incarnation = 0;
  // Outgoing: the Connect call waiting for the handshake; fulfilled once.
  std::shared_ptr<std::promise<std::pair<absl::Status, bool>>> attempt;  // (status, refused as a duplicate)

  std::vector<char> read_buffer;  // bytes [read_begin, read_end) not parsed yet
  size_t read_begin = 0;
  size_t read_end = 0;
  std::string writing;  // the batch async_write is sending
  bool close_after_flush = false;

  std::mutex write_mu;
  std::string queued ABSL_GUARDED_BY(write_mu);  // encoded frames waiting for the next write
  bool write_scheduled ABSL_GUARDED_BY(write_mu) = false;
};

struct Subscription {
  FrameHandler on_frame;
  LinkErrorHandler on_error;
};

struct HeldFrame {
  uint32_t from;
  uint64_t address;
  std::string payload;
};

struct Session {
  std::shared_ptr<Subscription> subscription;
  std::deque<HeldFrame> held;
  bool closed = false;    // unsubscribed: frames are dropped
  bool draining = false;  // subscribed, held frames not delivered yet: new ones queue behind them
};

uint64_t HeldBytes(const HeldFrame& frame) { return kHeaderBytes + frame.payload.size(); }

}  // namespace

// The state and the I/O-thread logic of a Bus.
//
// Locks: dispatch_mu_ is held by the I/O thread while it runs a handler, so
// Unsubscribe can wait for a running one; mu_ guards the tables shared with
// callers' threads. Order: dispatch_mu_, then mu_, then a connection's
// write_mu; no handler runs under mu_.
class Bus::Impl {
 public:
  explicit Impl(BusOptions options)
      : options_(std::move(options)),
        work_(asio::make_work_guard(io_)),
        acceptor_(io_),
        accept_retry_(io_),
        incarnation_(std::random_device{}() ^
                     (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                     static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())) {}

  ~Impl() {
    if (!thread_.joinable()) return;
    asio::post(io_, [this] {
      stopping_ = true;
      ErrorCode ec;
      acceptor_.close(ec);
      accept_retry_.cancel();
      const std::vector<std::shared_ptr<Connection>> open(connections_.begin(), connections_.end());
      for (const auto& conn : open) Close(conn, absl::CancelledError(Who() + ": bus shutting down"), false, false);
    });
    work_.reset();
    thread_.join();
  }

  absl::Status Listen() {
    if (options_.max_frame_bytes == 0) return absl::InvalidArgumentError("BusOptions.max_frame_bytes must be > 0");
    if (!(options_.connect_timeout_s > 0)) {
      return absl::InvalidArgumentError("BusOptions.connect_timeout_s must be > 0");
    }
    if (options_.token.size() > kMaxTokenBytes) {
      return absl::InvalidArgumentError(StrCat("BusOptions.token longer than ", kMaxTokenBytes, " bytes"));
    }
    ASSIGN_OR_RETURN(const tcp::endpoint endpoint, ParseEndpoint(options_.listen, /*resolve=*/false));
    ErrorCode ec;
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) local_ = acceptor_.local_endpoint(ec);
    if (ec) return absl::UnavailableError(StrCat(Who(), ": cannot listen on ", options_.listen, ": ", ec.message()));
    address_ = EndpointText(local_);
    Accept();
    thread_ = std::thread([this] { io_.run(); });
    return absl::OkStatus();
  }

  std::string address() const { return address_; }
  uint32_t node() const { return options_.node; }

  absl::Status Connect(uint32_t node, const std::string& address) {
    if (OnIoThread()) return absl::FailedPreconditionError(StrCat(Who(), ": Connect called from a bus handler"));
    if (node == options_.node) {
      return absl::InvalidArgumentError(StrCat(Who(), ": Connect to node ", node, ", this bus's own node"));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (links_.count(node)) return absl::OkStatus();
    }
    absl::StatusOr<tcp::endpoint> endpoint = ParseEndpoint(address, /*resolve=*/true);
    if (!endpoint.ok()) return absl::InvalidArgumentError(StrCat(Who(), ": Connect to node ", node, ": ",
                                                                  endpoint.status().message()));
    // A peer refuses a connection as a duplicate when it keeps another one
    // between us: the one it is opening itself (we then wait for it), or a
    // link it has not yet seen closing (after our Disconnect; we dial again
    // once it has). Either way: wait a little for a link, else dial again.
    const auto deadline = std::chrono::steady_clock::now() + Timeout();
    auto backoff = std::chrono::milliseconds(5);
    for (;;) {
      auto attempt = std::make_shared<std::promise<std::pair<absl::Status, bool>>>();
      std::future<std::pair<absl::Status, bool>> result = attempt->get_future();
      asio::post(io_, [this, node, endpoint = *endpoint, attempt] { StartOutgoing(node, endpoint, attempt); });
      auto [status, duplicate] = result.get();
      if (!duplicate) return status;
      std::unique_lock<std::mutex> lock(mu_);
      const auto until = std::min(deadline, std::chrono::steady_clock::now() + backoff);
      if (link_changed_.wait_until(lock, until, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return links_.count(node) > 0;
          })) {
        return absl::OkStatus();
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(StrCat(Who(), ": node ", node, " at ", address,
                                                  " kept refusing a duplicate connection for ",
                                                  options_.connect_timeout_s, " s"));
      }
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
  }

  absl::Status Subscribe(uint64_t session, FrameHandler on_frame, LinkErrorHandler on_error) {
    if (!on_frame || !on_error) {
      return absl::InvalidArgumentError(StrCat(Who(), ": Subscribe of session ", session, " without a handler"));
    }
    std::lock_guard<std::mutex> lock(mu_);
    Session& s = sessions_[session];
    if (s.subscription) return absl::AlreadyExistsError(StrCat(Who(), ": session ", session, " is subscribed"));
    s.closed = false;
    s.subscription = std::make_shared<Subscription>(Subscription{std::move(on_frame), std::move(on_error)});
    if (!s.held.empty()) {
      s.draining = true;
      asio::post(io_, [this, session, subscription = s.subscription] { Drain(session, subscription); });
    }
    return absl::OkStatus();
  }

  void Unsubscribe(uint64_t session) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Session& s = sessions_[session];
      s.subscription.reset();
      for (const HeldFrame& frame : s.held) pending_bytes_ -= HeldBytes(frame);
      frames_dropped_.fetch_add(static_cast<int64_t>(s.held.size()), std::memory_order_relaxed);
      s.held.clear();
      s.closed = true;
      s.draining = false;
    }
    // A handler of the session may be running right now; wait for it (unless
    // it is the caller).
    if (!OnIoThread()) {
      std::lock_guard<std::mutex> wait_for_handler(dispatch_mu_);
    }
  }

  absl::Status Send(uint32_t node, uint64_t session, uint64_t address, std::string_view payload) {
    if (payload.size() > options_.max_frame_bytes) {
      return absl::InvalidArgumentError(StrCat(Who(), ": frame of ", payload.size(), " bytes for node ", node,
                                               " exceeds max_frame_bytes ", options_.max_frame_bytes));
    }
    std::shared_ptr<Connection> conn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = links_.find(node);
      if (it == links_.end()) {
        auto lost = lost_.find(node);
        if (lost != lost_.end()) {
          return absl::UnavailableError(StrCat(Who(), ": link to node ", node, " lost: ", lost->second));
        }
        if (node == options_.node) {
          return absl::FailedPreconditionError(StrCat(Who(), ": Send to node ", node, ", this bus itself"));
        }
        return absl::FailedPreconditionError(StrCat(Who(), ": no link to node ", node, " (Connect first)"));
      }
      conn = it->second;
    }
    Enqueue(conn, FrameType::kData, session, address, payload);
    frames_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(static_cast<int64_t>(kHeaderBytes + payload.size()), std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status Flush(double timeout_s) {
    std::vector<std::shared_ptr<Connection>> links;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [node, conn] : links_) links.push_back(conn);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(0.0, timeout_s));
    for (;;) {
      std::vector<uint32_t> writing;
      for (const auto& conn : links) {
        {
          // A link closed meanwhile writes nothing more.
          std::lock_guard<std::mutex> lock(mu_);
          auto it = links_.find(conn->node);
          if (it == links_.end() || it->second != conn) continue;
        }
        std::lock_guard<std::mutex> lock(conn->write_mu);
        if (conn->write_scheduled) writing.push_back(conn->node);
      }
      if (writing.empty()) return absl::OkStatus();
      if (std::chrono::steady_clock::now() >= until) {
        return absl::DeadlineExceededError(StrCat(Who(), ": frames to node(s) ", absl::StrJoin(writing, ", "),
                                                  " still unwritten after ", timeout_s, " s"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void Disconnect(uint32_t node) {
    std::shared_ptr<Connection> conn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = links_.find(node);
      if (it == links_.end()) return;
      conn = std::move(it->second);
      links_.erase(it);
    }
    link_changed_.notify_all();
    asio::post(io_, [this, conn] {
      Close(conn, absl::CancelledError(StrCat(Who(), ": link to node ", conn->node, " disconnected")),
            /*report=*/false, /*flush=*/true);
    });
  }

  Bus::Stats stats() const {
    Bus::Stats stats{};
    stats.frames_sent = frames_sent_.load(std::memory_order_relaxed);
    stats.frames_received = frames_received_.load(std::memory_order_relaxed);
    stats.frames_dropped = frames_dropped_.load(std::memory_order_relaxed);
    stats.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
    stats.bytes_received = bytes_received_.load(std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    stats.links = static_cast<int>(links_.size());
    return stats;
  }

 private:
  std::string Who() const { return StrCat("bus node ", options_.node); }
  bool OnIoThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  std::chrono::steady_clock::duration Timeout() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options_.connect_timeout_s));
  }
  std::string Describe(const Connection& conn) const {
    if (!conn.node_known) return StrCat(Who(), ": connection from ", conn.peer);
    return StrCat(Who(), ": link to node ", conn.node, " (", conn.peer, ")");
  }
  // Failures of links that were live, and of handshakes a peer started with
  // us, go to the subscribers; an outgoing handshake's failure goes to its
  // Connect call.
  static bool Reportable(const Connection& conn) {
    return conn.node_known && (conn.state == Connection::State::kLive || !conn.outgoing);
  }

  // --- I/O thread from here on ---

  void Accept() {
    acceptor_.async_accept([this](ErrorCode ec, tcp::socket socket) {
      if (stopping_ || ec == asio::error::operation_aborted) return;
      if (ec) {
        // E.g. out of file descriptors: try again shortly rather than spin.
        TLOG_WARN("{}: accept failed: {}", Who(), ec.message());
        accept_retry_.expires_after(std::chrono::milliseconds(50));
        accept_retry_.async_wait([this](ErrorCode wait_ec) {
          if (!wait_ec && !stopping_) Accept();
        });
        return;
      }
      auto conn = std::make_shared<Connection>(std::move(socket), /*is_outgoing=*/false);
      ErrorCode ignored;
      conn->socket.set_option(tcp::no_delay(true), ignored);
      const tcp::endpoint remote = conn->socket.remote_endpoint(ignored);
      conn->peer = ignored ? std::string("?") : EndpointText(remote);
      connections_.insert(conn);
      ArmHandshakeTimer(conn);
      Read(conn);
      Accept();
    });
  }

  void StartOutgoing(uint32_t node, const tcp::endpoint& endpoint,
                     std::shared_ptr<std::promise<std::pair<absl::Status, bool>>> attempt) {
    if (stopping_) {
      attempt->set_value({absl::CancelledError(Who() + ": bus shutting down"), false});
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (links_.count(node)) {
        attempt->set_value({absl::OkStatus(), false});
        return;
      }
    }
    auto conn = std::make_shared<Connection>(tcp::socket(io_), /*is_outgoing=*/true);
    conn->node = node;
    conn->node_known = true;
    conn->initiator = options_.node;
    conn->peer = EndpointText(endpoint);
    conn->attempt = std::move(attempt);
    connections_.insert(conn);
    ++pending_outgoing_[node];
    ArmHandshakeTimer(conn);
    conn->socket.async_connect(endpoint, [this, conn](ErrorCode ec) {
      if (conn->state == Connection::State::kClosed) return;
      if (ec) {
        Close(conn, absl::UnavailableError(StrCat(Describe(*conn), ": cannot connect: ", ec.message())), false, false);
        return;
      }
      ErrorCode ignored;
      conn->socket.set_option(tcp::no_delay(true), ignored);
      Enqueue(conn, FrameType::kHello, 0, 0, EncodeHello(OurHello(conn->node)));
      Read(conn);
    });
  }

  Hello OurHello(uint32_t to) const {
    Hello hello;
    hello.version = kProtocolVersion;
    hello.from = options_.node;
    hello.to = to;
    hello.incarnation = incarnation_;
    hello.token = options_.token;
    return hello;
  }

  void ArmHandshakeTimer(const std::shared_ptr<Connection>& conn) {
    conn->timer.expires_after(Timeout());
    conn->timer.async_wait([this, conn](ErrorCode ec) {
      if (ec || conn->state != Connection::State::kHandshaking) return;
      const std::string what = conn->outgoing ? "handshake did not complete" : "no handshake";
      Close(conn,
            absl::DeadlineExceededError(StrCat(Describe(*conn), ": ", what, " within ", options_.connect_timeout_s,
                                               " s")),
            Reportable(*conn), false);
    });
  }

  void Read(const std::shared_ptr<Connection>& conn) {
    std::vector<char>& buffer = conn->read_buffer;
    if (conn->read_begin == conn->read_end) {
      conn->read_begin = conn->read_end = 0;
      if (buffer.size() > kKeptBufferBytes) std::vector<char>().swap(buffer);
    }
    // Until the handshake, frames are at most kMaxHandshakeBytes: a
    // stranger's connection (silent ones included, until their deadline)
    // costs a few KiB, not a read chunk of a live link.
    const size_t chunk =
        conn->state == Connection::State::kLive ? kReadChunk : kHeaderBytes + kMaxHandshakeBytes;
    if (buffer.size() - conn->read_end < chunk / 4) {
      Compact(*conn);
      if (buffer.size() - conn->read_end < chunk / 4) buffer.resize(conn->read_end + chunk);
    }
    conn->socket.async_read_some(
        asio::buffer(buffer.data() + conn->read_end, buffer.size() - conn->read_end),
        [this, conn](ErrorCode ec, size_t bytes) { OnRead(conn, ec, bytes); });
  }

  static void Compact(Connection& conn) {
    if (conn.read_begin == 0) return;
    std::memmove(conn.read_buffer.data(), conn.read_buffer.data() + conn.read_begin, conn.read_end - conn.read_begin);
    conn.read_end -= conn.read_begin;
    conn.read_begin = 0;
  }

  void OnRead(const std::shared_ptr<Connection>& conn, ErrorCode ec, size_t bytes) {
    if (conn->state == Connection::State::kClosed) return;
    if (ec) {
      std::string why = ec == asio::error::eof ? "closed by the peer" : StrCat("read failed: ", ec.message());
      if (conn->read_end > conn->read_begin) {
        why += StrCat(" in the middle of a frame (", conn->read_end - conn->read_begin, " bytes of it received)");
      }
      Close(conn, absl::UnavailableError(StrCat(Describe(*conn), ": ", why)), Reportable(*conn), false);
      return;
    }
    conn->read_end += bytes;
    while (conn->read_end - conn->read_begin >= kHeaderBytes) {
      const char* start = conn->read_buffer.data() + conn->read_begin;
      const Header header = ParseHeader(start);
      if (header.magic != kMagic) {
        return ProtocolError(conn, StrCat("bad frame: magic 0x", fmt::format("{:08x}", header.magic),
                                          " (expected 0x", fmt::format("{:08x}", kMagic), ")"));
      }
      if (header.type < static_cast<uint32_t>(FrameType::kHello) ||
          header.type > static_cast<uint32_t>(FrameType::kData)) {
        return ProtocolError(conn, StrCat("bad frame: unknown type ", header.type));
      }
      const uint32_t limit =
          conn->state == Connection::State::kLive ? options_.max_frame_bytes : kMaxHandshakeBytes;
      if (header.length > limit) {
        return ProtocolError(conn, StrCat("bad frame: ", header.length, " bytes exceed the limit of ", limit,
                                          conn->state == Connection::State::kLive ? " (max_frame_bytes)"
                                                                                   : " before the handshake"),
                             absl::StatusCode::kResourceExhausted);
      }
      const size_t frame_bytes = kHeaderBytes + header.length;
      if (conn->read_end - conn->read_begin < frame_bytes) {
        if (conn->read_buffer.size() - conn->read_begin < frame_bytes) {
          Compact(*conn);
          if (conn->read_buffer.size() < frame_bytes) conn->read_buffer.resize(frame_bytes);
        }
        break;
      }
      const std::string_view payload(start + kHeaderBytes, header.length);
      conn->read_begin += frame_bytes;
      // The buffer is not touched again before the next Read, so `payload`
      // stays valid through the handler.
      if (!HandleFrame(conn, header, payload)) return;
    }
    Read(conn);
  }

  // False when the connection was closed.
  bool HandleFrame(const std::shared_ptr<Connection>& conn, const Header& header, std::string_view payload) {
    const auto type = static_cast<FrameType>(header.type);
    switch (conn->state) {
      case Connection::State::kHandshaking:
        if (!conn->outgoing && type == FrameType::kHello) return HandleHello(conn, payload);
        if (conn->outgoing && type == FrameType::kHelloAck) return HandleHelloAck(conn, payload);
        if (conn->outgoing && type == FrameType::kReject) return HandleReject(conn, payload);
        ProtocolError(conn, StrCat("frame of type ", header.type, " before the handshake"));
        return false;
      case Connection::State::kLive:
        if (type == FrameType::kData) {
          frames_received_.fetch_add(1, std::memory_order_relaxed);
          bytes_received_.fetch_add(static_cast<int64_t>(kHeaderBytes + payload.size()), std::memory_order_relaxed);
          absl::Status status = Dispatch(conn->node, header.session, header.address, payload);
          if (status.ok()) return conn->state != Connection::State::kClosed;
          Close(conn, absl::Status(status.code(), StrCat(Describe(*conn), ": ", status.message())), true, false);
          return false;
        }
        if (type == FrameType::kHello || type == FrameType::kHelloAck) {
          ProtocolError(conn, "a second handshake on a live link");
          return false;
        }
        if (type == FrameType::kReject) {
          ProtocolError(conn, StrCat("the peer refused the link: ", payload.substr(std::min<size_t>(4, payload.size()))));
          return false;
        }
        ProtocolError(conn, StrCat("bad frame: type ", header.type, " on a live link"));
        return false;
      case Connection::State::kClosed:
        return false;
    }
    return false;
  }

  void ProtocolError(const std::shared_ptr<Connection>& conn, const std::string& what,
                     absl::StatusCode code = absl::StatusCode::kDataLoss) {
    Close(conn, absl::Status(code, StrCat(Describe(*conn), ": ", what, "; connection closed")), Reportable(*conn),
          false);
  }

  // Sends a Reject with `reason` and closes once it is written.
  void Refuse(const std::shared_ptr<Connection>& conn, RejectReason reason, const std::string& text,
              absl::Status status, bool report) {
    std::string payload;
    PutU32(&payload, static_cast<uint32_t>(reason));
    payload += text;
    Enqueue(conn, FrameType::kReject, 0, 0, payload);
    Close(conn, std::move(status), report, /*flush=*/true);
  }

  // Whether to report the refusal of an unauthenticated Hello as a failure of
  // the node it claims. Anyone can claim any node, so not while that node has
  // a live link: a stranger must not make a healthy link look failed to the
  // subscribers. Such a refusal is logged only.
  bool ReportRefusal(const Connection& conn, const absl::Status& why) {
    bool live = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live = links_.count(conn.node) > 0;
    }
    if (live) TLOG_WARN("{} (not reported: node {} has a live link)", why.message(), conn.node);
    return !live;
  }

  bool HandleHello(const std::shared_ptr<Connection>& conn, std::string_view payload) {
    absl::StatusOr<Hello> hello = DecodeHello(payload);
    if (!hello.ok()) {
      Refuse(conn, RejectReason::kProtocol, std::string(hello.status().message()),
             absl::InvalidArgumentError(StrCat(Describe(*conn), ": bad handshake: ", hello.status().message())), false);
      return false;
    }
    if (hello->version != kProtocolVersion) {
      const std::string text =
          StrCat("protocol version ", hello->version, " is not supported (node ", options_.node, " speaks ",
                 kProtocolVersion, ")");
      Refuse(conn, RejectReason::kVersion, text,
             absl::FailedPreconditionError(StrCat(Describe(*conn), ": handshake refused: ", text)), false);
      return false;
    }
    conn->node = hello->from;
    conn->node_known = true;
    conn->initiator = hello->from;
    conn->peer_incarnation = hello->incarnation;
    if (hello->to != options_.node || hello->from == options_.node) {
      const std::string text = StrCat("node ", hello->from, " asked for node ", hello->to, ", this is node ",
                                      options_.node);
      absl::Status why = absl::FailedPreconditionError(StrCat(Describe(*conn), ": handshake refused: ", text));
      const bool report = ReportRefusal(*conn, why);
      Refuse(conn, RejectReason::kWrongNode, text, std::move(why), report);
      return false;
    }
    if (!TokensEqual(options_.token, hello->token)) {
      absl::Status why = absl::PermissionDeniedError(
          StrCat(Describe(*conn), ": handshake refused: authentication failed (token mismatch)"));
      const bool report = ReportRefusal(*conn, why);
      Refuse(conn, RejectReason::kAuth, "authentication failed (token mismatch)", std::move(why), report);
      return false;
    }
    std::shared_ptr<Connection> existing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = links_.find(conn->node);
      if (it != links_.end()) existing = it->second;
    }
    // The same peer process dialling while a link to it exists, or both
    // sides dialling at once: the lower node's connection wins, and the
    // loser's Connect waits for it.
    const bool same_peer = existing && existing->peer_incarnation == hello->incarnation;
    const auto pending = pending_outgoing_.find(conn->node);
    const bool racing = pending != pending_outgoing_.end() && pending->second > 0 && options_.node < conn->node;
    if (same_peer || racing) {
      Refuse(conn, RejectReason::kDuplicate, "duplicate connection", absl::OkStatus(), false);
      return false;
    }
    Enqueue(conn, FrameType::kHelloAck, 0, 0, EncodeHello(OurHello(conn->node)));
    return Register(conn);
  }

  bool HandleHelloAck(const std::shared_ptr<Connection>& conn, std::string_view payload) {
    absl::StatusOr<Hello> hello = DecodeHello(payload);
    if (!hello.ok()) {
      ProtocolError(conn, StrCat("bad handshake reply: ", hello.status().message()), absl::StatusCode::kDataLoss);
      return false;
    }
    if (hello->version != kProtocolVersion) {
      Close(conn,
            absl::FailedPreconditionError(StrCat(Describe(*conn), ": the peer speaks protocol version ",
                                                 hello->version, ", this bus ", kProtocolVersion)),
            false, false);
      return false;
    }
    if (hello->from != conn->node || hello->to != options_.node) {
      Close(conn,
            absl::FailedPreconditionError(StrCat(Describe(*conn), ": found node ", hello->from,
                                                 " (expecting node ", hello->to, ") there")),
            false, false);
      return false;
    }
    if (!TokensEqual(options_.token, hello->token)) {
      Close(conn,
            absl::PermissionDeniedError(
                StrCat(Describe(*conn), ": handshake refused: authentication failed (the peer's token does not match)")),
            false, false);
      return false;
    }
    conn->peer_incarnation = hello->incarnation;
    return Register(conn);
  }

  bool HandleReject(const std::shared_ptr<Connection>& conn, std::string_view payload) {
    const uint32_t reason = payload.size() >= 4 ? GetU32(payload.data()) : 0;
    const std::string text(payload.substr(std::min<size_t>(4, payload.size())));
    if (reason == static_cast<uint32_t>(RejectReason::kDuplicate)) {
      if (conn->attempt) {
        conn->attempt->set_value({absl::OkStatus(), true});
        conn->attempt.reset();
      }
      Close(conn, absl::OkStatus(), false, false);
      return false;
    }
    absl::StatusCode code = absl::StatusCode::kUnavailable;
    if (reason == static_cast<uint32_t>(RejectReason::kAuth)) code = absl::StatusCode::kPermissionDenied;
    if (reason == static_cast<uint32_t>(RejectReason::kVersion) ||
        reason == static_cast<uint32_t>(RejectReason::kWrongNode)) {
      code = absl::StatusCode::kFailedPrecondition;
    }
    if (reason == static_cast<uint32_t>(RejectReason::kProtocol)) code = absl::StatusCode::kInvalidArgument;
    Close(conn, absl::Status(code, StrCat(Describe(*conn), ": handshake refused by the peer: ", text)), false, false);
    return false;
  }

  // Makes `conn` the live link to its node.
  bool Register(const std::shared_ptr<Connection>& conn) {
    std::shared_ptr<Connection> existing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = links_.find(conn->node);
      if (it != links_.end()) existing = it->second;
    }
    if (existing && existing->peer_incarnation != conn->peer_incarnation) {
      Close(existing,
            absl::UnavailableError(StrCat(Describe(*existing), ": the node restarted (a new process connected)")),
            true, false);
    } else if (existing) {
      const uint32_t winner = std::min(options_.node, conn->node);
      if (existing->initiator == winner) {
        if (conn->attempt) {
          conn->attempt->set_value({absl::OkStatus(), false});
          conn->attempt.reset();
        }
        Close(conn, absl::OkStatus(), false, true);
        return false;
      }
      Close(existing, absl::OkStatus(), false, true);
    }
    if (conn->outgoing) --pending_outgoing_[conn->node];
    conn->state = Connection::State::kLive;
    conn->timer.cancel();
    {
      std::lock_guard<std::mutex> lock(mu_);
      links_[conn->node] = conn;
      lost_.erase(conn->node);
    }
    link_changed_.notify_all();
    if (conn->attempt) {
      conn->attempt->set_value({absl::OkStatus(), false});
      conn->attempt.reset();
    }
    return true;
  }

  // Delivers a data frame, or holds it for a session nobody subscribed yet.
  absl::Status Dispatch(uint32_t from, uint64_t session, uint64_t address, std::string_view payload) {
    std::lock_guard<std::mutex> dispatching(dispatch_mu_);
    std::shared_ptr<Subscription> subscription;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sessions_.find(session);
      if (it != sessions_.end() && it->second.closed) {
        frames_dropped_.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();
      }
      if (it == sessions_.end() || !it->second.subscription || it->second.draining) {
        const uint64_t bytes = kHeaderBytes + payload.size();
        if (pending_bytes_ + bytes > options_.max_pending_bytes) {
          frames_dropped_.fetch_add(1, std::memory_order_relaxed);
          return absl::ResourceExhaustedError(StrCat("frames held for sessions nobody subscribed exceed ",
                                                     "max_pending_bytes ", options_.max_pending_bytes, " (session ",
                                                     session, ")"));
        }
        pending_bytes_ += bytes;
        sessions_[session].held.push_back(HeldFrame{from, address, std::string(payload)});
        return absl::OkStatus();
      }
      subscription = it->second.subscription;
    }
    subscription->on_frame(from, address, payload);
    return absl::OkStatus();
  }

  // Delivers what was held for `session` before it was subscribed, in order.
  void Drain(uint64_t session, const std::shared_ptr<Subscription>& subscription) {
    std::lock_guard<std::mutex> dispatching(dispatch_mu_);
    for (;;) {
      HeldFrame frame;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(session);
        if (it == sessions_.end() || it->second.subscription != subscription) return;
        if (it->second.held.empty()) {
          it->second.draining = false;
          return;
        }
        frame = std::move(it->second.held.front());
        it->second.held.pop_front();
        pending_bytes_ -= HeldBytes(frame);
      }
      subscription->on_frame(frame.from, frame.address, frame.payload);
    }
  }

  void ReportError(uint32_t node, const absl::Status& error) {
    std::lock_guard<std::mutex> dispatching(dispatch_mu_);
    std::vector<std::pair<uint64_t, std::shared_ptr<Subscription>>> subscribers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [session, s] : sessions_) {
        if (s.subscription) subscribers.emplace_back(session, s.subscription);
      }
    }
    for (const auto& [session, subscription] : subscribers) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(session);
        if (it == sessions_.end() || it->second.subscription != subscription) continue;
      }
      subscription->on_error(node, error);
    }
  }

  // Queues one frame on `conn` (any thread).
  void Enqueue(const std::shared_ptr<Connection>& conn, FrameType type, uint64_t session, uint64_t address,
               std::string_view payload) {
    bool schedule = false;
    {
      std::lock_guard<std::mutex> lock(conn->write_mu);
      AppendFrame(&conn->queued, type, session, address, payload);
      schedule = !conn->write_scheduled;
      conn->write_scheduled = true;
    }
    if (schedule) asio::post(io_, [this, conn] { StartWrite(conn); });
  }

  // Writes everything queued as one batch; one write in flight per link, so
  // frames never interleave.
  void StartWrite(const std::shared_ptr<Connection>& conn) {
    {
      std::lock_guard<std::mutex> lock(conn->write_mu);
      if (!conn->socket.is_open() || conn->queued.empty()) {
        conn->queued.clear();
        conn->write_scheduled = false;
        if (conn->close_after_flush) CloseSocket(conn);
        return;
      }
      std::swap(conn->writing, conn->queued);
    }
    asio::async_write(conn->socket, asio::buffer(conn->writing), [this, conn](ErrorCode ec, size_t) {
      if (conn->writing.capacity() > kKeptBufferBytes) {
        std::string().swap(conn->writing);
      } else {
        conn->writing.clear();
      }
      if (ec) {
        if (conn->state != Connection::State::kClosed) {
          Close(conn, absl::UnavailableError(StrCat(Describe(*conn), ": write failed: ", ec.message())),
                Reportable(*conn), false);
        }
        CloseSocket(conn);
        return;
      }
      StartWrite(conn);
    });
  }

  // Ends `conn` as a link (idempotent): tables updated, its Connect answered,
  // subscribers told when `report`. The socket closes now, or with `flush`
  // once what is queued is written (within connect_timeout_s).
  void Close(const std::shared_ptr<Connection>& conn, absl::Status why, bool report, bool flush) {
    if (conn->state == Connection::State::kClosed) {
      if (!flush) CloseSocket(conn);
      return;
    }
    if (conn->outgoing && conn->state == Connection::State::kHandshaking) --pending_outgoing_[conn->node];
    conn->state = Connection::State::kClosed;
    bool was_link = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = links_.find(conn->node);
      if (conn->node_known && it != links_.end() && it->second == conn) {
        links_.erase(it);
        was_link = true;
        if (!why.ok() && report) lost_[conn->node] = std::string(why.message());
      }
    }
    if (was_link) link_changed_.notify_all();
    if (conn->attempt) {
      conn->attempt->set_value({why.ok() ? absl::UnavailableError(StrCat(Describe(*conn), ": closed")) : why, false});
      conn->attempt.reset();
    }
    if (flush) {
      conn->close_after_flush = true;
      conn->timer.expires_after(Timeout());
      conn->timer.async_wait([this, conn](ErrorCode ec) {
        if (!ec) CloseSocket(conn);
      });
      bool idle = false;
      {
        std::lock_guard<std::mutex> lock(conn->write_mu);
        idle = !conn->write_scheduled;
      }
      if (idle) CloseSocket(conn);
    } else {
      CloseSocket(conn);
    }
    if (why.ok() || stopping_) return;
    if (report && conn->node_known) {
      // The subscribers hear of it and judge (a peer that ended its job
      // closes its links: routine for the runtime).
      TLOG_INFO("{}", why.message());
      ReportError(conn->node, why);
    } else if (!conn->node_known) {
      TLOG_WARN("{}", why.message());
    }
  }

  void CloseSocket(const std::shared_ptr<Connection>& conn) {
    conn->timer.cancel();
    if (conn->socket.is_open()) {
      ErrorCode ignored;
      conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
      conn->socket.close(ignored);
    }
    connections_.erase(conn);
  }

  const BusOptions options_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  const uint64_t incarnation_;
  tcp::endpoint local_;
  std::string address_;

  // I/O thread only.
  bool stopping_ = false;
  std::set<std::shared_ptr<Connection>> connections_;  // every open socket
  std::map<uint32_t, int> pending_outgoing_;             // node -> outgoing handshakes in flight

  std::mutex dispatch_mu_;  // held while a handler runs
  mutable std::mutex mu_;
  std::condition_variable link_changed_;
  std::map<uint32_t, std::shared_ptr<Connection>> links_ ABSL_GUARDED_BY(mu_);  // live links by node
  std::map<uint32_t, std::string> lost_ ABSL_GUARDED_BY(mu_);  // node -> why its link failed, until relinked
  std::unordered_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  std::atomic<int64_t> frames_sent_{0};
  std::atomic<int64_t> frames_received_{0};
  std::atomic<int64_t> frames_dropped_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};

  std::thread thread_;  // runs io_; started last, joined first
};

absl::StatusOr<std::unique_ptr<Bus>> Bus::Start(BusOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<Bus>(new Bus(std::move(impl)));
}

Bus::Bus(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Bus::~Bus() = default;

std::string Bus::address() const { return impl_->address(); }
uint32_t Bus::node() const { return impl_->node(); }
absl::Status Bus::Connect(uint32_t node, const std::string& address) { return impl_->Connect(node, address); }
absl::Status Bus::Subscribe(uint64_t session, FrameHandler on_frame, LinkErrorHandler on_error) {
  return impl_->Subscribe(session, std::move(on_frame), std::move(on_error));
}
void Bus::Unsubscribe(uint64_t session) { impl_->Unsubscribe(session); }
absl::Status Bus::Send(uint32_t node, uint64_t session, uint64_t address, std::string_view payload) {
  return impl_->Send(node, session, address, payload);
}
void Bus::Disconnect(uint32_t node) { impl_->Disconnect(node); }
absl::Status Bus::Flush(double timeout_s) { return impl_->Flush(timeout_s); }
Bus::Stats Bus::stats() const { return impl_->stats(); }

}  // namespace tessera::comm::bus
