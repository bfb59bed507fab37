#include "cluster/metrics_http.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio.hpp"
#include "fmt/format.h"

namespace tessera::cluster {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
class Connection;
}  // namespace

struct MetricsHttpServer::State {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
  std::deque<std::weak_ptr<Connection>> connections;  // oldest first
};

std::string PrometheusValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

std::string PrometheusLabel(std::string_view value) {
  std::string out;
  for (const char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

constexpr size_t kMaxRequestBytes = 8192;

// Where a request's head ends: an empty line, "\r\n\r\n" or, as clients
// that end lines with "\n" alone send it (HTTP allows reading them),
// "\n\n" (such a request waited out the 2 s unanswered).
struct EndOfHead {
  template <typename Iterator>
  std::pair<Iterator, bool> operator()(Iterator begin, Iterator end) const {
    for (Iterator it = begin; it != end; ++it) {
      if (*it != '\n') continue;
      Iterator next = it;
      ++next;
      if (next != end && *next == '\r') ++next;
      if (next != end && *next == '\n') return {++next, true};
    }
    // The next read searches again from here: its last two bytes, where an
    // empty line cut between two segments begins ("\n" | "\r\n"; from
    // `end`, the rest of it was never matched and the request waited out
    // its 2 s unanswered).
    Iterator from = end;
    for (int i = 0; i < 2 && from != begin; ++i) --from;
    return {from, false};
  }
};

}  // namespace
}  // namespace tessera::cluster

template <>
struct boost::asio::is_match_condition<tessera::cluster::EndOfHead> : std::true_type {};

namespace tessera::cluster {
namespace {

// One connection: read the request head, answer, close. Owned by the
// handlers' shared_ptr copies.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const std::function<std::string()>* render)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), render_(render) {}

  bool answering() const { return answering_; }

  // Ends it now (its pending handlers run aborted and let it go).
  void Close() {
    timer_.cancel();
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  void Begin() {
    Deadline();
    auto self = shared_from_this();
    asio::async_read_until(socket_, asio::dynamic_buffer(request_, kMaxRequestBytes), EndOfHead(),
                           [self](const boost::system::error_code& error, size_t) { self->Answer(error); });
  }

 private:
  // The connection closes 2 s from now unless the next step ends first
  // (a deadline whose wait completed as the step ended, too late for
  // cancel(), is known by its number: it closed the answered connection).
  void Deadline() {
    auto self = shared_from_this();
    const uint64_t armed = ++deadline_;
    timer_.expires_after(std::chrono::seconds(2));
    timer_.async_wait([self, armed](const boost::system::error_code& error) {
      if (!error && armed == self->deadline_) {
        boost::system::error_code ignored;
        self->socket_.close(ignored);
      }
    });
  }

  void Answer(const boost::system::error_code& error) {
    timer_.cancel();
    ++deadline_;
    answering_ = true;
    // A head past 8 KiB is answered 431 (the connection was reset).
    const bool too_large = error == asio::error::not_found;
    if (error && !too_large) return;
    // HEAD is GET without the body (its Content-Length the body's), as
    // HTTP asks of every resource GET serves (a monitor's probe used it).
    const bool head = !too_large && request_.starts_with("HEAD ");
    // (A head may be as short as "\n\n": substr past its end threw, out
    // of the server's thread.)
    const size_t method_bytes = head ? 5 : 4;
    const std::string_view path =
        request_.size() > method_bytes ? std::string_view(request_).substr(method_bytes) : std::string_view();
    const bool metrics = !too_large && (head || request_.starts_with("GET ")) &&
                         (path.starts_with("/metrics ") || path.starts_with("/metrics?"));
    const std::string body = metrics     ? (*render_)()
                             : too_large ? std::string("request head over 8 KiB\n")
                                         : std::string("not found: try /metrics\n");
    response_ = absl::StrCat("HTTP/1.0 ",
                             metrics     ? "200 OK"
                             : too_large ? "431 Request Header Fields Too Large"
                                         : "404 Not Found",
                             "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ", body.size(),
                             "\r\nConnection: close\r\n\r\n", head ? std::string() : body);
    // (A client that never reads held the connection for good.)
    Deadline();
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(response_), [self](const boost::system::error_code&, size_t) {
      self->timer_.cancel();
      ++self->deadline_;
      boost::system::error_code ignored;
      self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
    });
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  const std::function<std::string()>* render_;
  uint64_t deadline_ = 0;   // the armed deadline's number
  bool answering_ = false;  // its request read: the answer is being written
  std::string request_;
  std::string response_;
};

void Accept(MetricsHttpServer::State& state, const std::function<std::string()>* render) {
  state.acceptor.async_accept([&state, render](const boost::system::error_code& error, tcp::socket socket) {
    if (error == asio::error::operation_aborted || !state.acceptor.is_open()) return;
    if (error) {
      // (Out of descriptors, EMFILE: accepting again at once failed again
      // at once, a core spinning until a connection closed.)
      state.retry.expires_after(std::chrono::milliseconds(100));
      state.retry.async_wait([&state, render](const boost::system::error_code& waited) {
        if (!waited && state.acceptor.is_open()) Accept(state, render);
      });
      return;
    }
    // At most kMaxConnections at once, the oldest still reading its request
    // closed for a new one (one being answered finishes, unless all are):
    // idle clients can neither hold the master's descriptors (each held
    // one for 2 s, without bound) nor keep a scrape out.
    std::erase_if(state.connections, [](const std::weak_ptr<Connection>& c) { return c.expired(); });
    if (state.connections.size() >= static_cast<size_t>(MetricsHttpServer::kMaxConnections)) {
      auto victim = std::find_if(state.connections.begin(), state.connections.end(), [](const auto& c) {
        const std::shared_ptr<Connection> live = c.lock();
        return live != nullptr && !live->answering();
      });
      if (victim == state.connections.end()) victim = state.connections.begin();
      if (const std::shared_ptr<Connection> closed = victim->lock()) closed->Close();
      state.connections.erase(victim);
    }
    auto connection = std::make_shared<Connection>(std::move(socket), render);
    state.connections.push_back(connection);
    connection->Begin();
    Accept(state, render);
  });
}

}  // namespace

MetricsHttpServer::MetricsHttpServer(std::function<std::string()> render) : render_(std::move(render)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::StatusOr<int> MetricsHttpServer::Start(const std::string& host, int port) {
  if (state_ != nullptr) return absl::FailedPreconditionError("metrics server already started");
  auto state = std::make_unique<State>();
  boost::system::error_code error;
  const auto address = asio::ip::make_address(host, error);
  if (error)
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_host '", host, "' is not a numeric IP address (127.0.0.1, 0.0.0.0, ::1, ...)"));
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("metrics: bad port ", port));
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  state->acceptor.open(endpoint.protocol(), error);
  if (!error) state->acceptor.set_option(tcp::acceptor::reuse_address(true), error);
  if (!error) state->acceptor.bind(endpoint, error);
  if (!error) state->acceptor.listen(asio::socket_base::max_listen_connections, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", host, ":", port, ": ", error.message()));
  }
  const int bound = state->acceptor.local_endpoint().port();
  Accept(*state, &render_);
  state_ = std::move(state);
  thread_ = std::thread([this] { state_->io.run(); });
  return bound;
}

void MetricsHttpServer::Stop() {
  if (state_ == nullptr) return;
  asio::post(state_->io, [this] {
    boost::system::error_code ignored;
    state_->acceptor.close(ignored);
    state_->retry.cancel();
  });
  state_->io.stop();
  if (thread_.joinable()) thread_.join();
  state_.reset();
}

}  // namespace tessera::cluster
