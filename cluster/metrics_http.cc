#include "cluster/metrics_http.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio.hpp"

namespace tessera::cluster {

namespace asio = boost::asio;
using asio::ip::tcp;

struct MetricsHttpServer::State {
  asio::io_context io;
  tcp::acceptor acceptor{io};
};

namespace {

// One connection: read the request head, answer, close. Owned by the
// handlers' shared_ptr copies.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const std::function<std::string()>* render)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), render_(render) {}

  void Begin() {
    auto self = shared_from_this();
    timer_.expires_after(std::chrono::seconds(2));
    timer_.async_wait([self](const boost::system::error_code& error) {
      if (!error) {
        boost::system::error_code ignored;
        self->socket_.close(ignored);
      }
    });
    asio::async_read_until(socket_, asio::dynamic_buffer(request_, 8192), "\r\n\r\n",
                           [self](const boost::system::error_code& error, size_t) { self->Answer(error); });
  }

 private:
  void Answer(const boost::system::error_code& error) {
    timer_.cancel();
    if (error) return;
    // HEAD is GET without the body (its Content-Length the body's), as
    // HTTP asks of every resource GET serves (a monitor's probe used it).
    const bool head = request_.starts_with("HEAD ");
    const std::string_view path = std::string_view(request_).substr(head ? 5 : 4);
    const bool metrics =
        (head || request_.starts_with("GET ")) && (path.starts_with("/metrics ") || path.starts_with("/metrics?"));
    const std::string body = metrics ? (*render_)() : "not found: try /metrics\n";
    response_ = absl::StrCat("HTTP/1.0 ", metrics ? "200 OK" : "404 Not Found",
                             "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ", body.size(),
                             "\r\nConnection: close\r\n\r\n", head ? std::string() : body);
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(response_), [self](const boost::system::error_code&, size_t) {
      boost::system::error_code ignored;
      self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
    });
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  const std::function<std::string()>* render_;
  std::string request_;
  std::string response_;
};

void Accept(tcp::acceptor& acceptor, const std::function<std::string()>* render) {
  acceptor.async_accept([&acceptor, render](const boost::system::error_code& error, tcp::socket socket) {
    if (error == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!error) std::make_shared<Connection>(std::move(socket), render)->Begin();
    Accept(acceptor, render);
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
  Accept(state->acceptor, &render_);
  state_ = std::move(state);
  thread_ = std::thread([this] { state_->io.run(); });
  return bound;
}

void MetricsHttpServer::Stop() {
  if (state_ == nullptr) return;
  asio::post(state_->io, [this] {
    boost::system::error_code ignored;
    state_->acceptor.close(ignored);
  });
  state_->io.stop();
  if (thread_.joinable()) thread_.join();
  state_.reset();
}

}  // namespace tessera::cluster
