#pragma once
// A tiny HTTP/1.0 server for Prometheus: GET /metrics answers `render()`
// (text exposition format); anything else 404. Connections are served on
// its own thread, at most kMaxConnections at once (a new one closes the
// oldest still reading its request, else the oldest); a request must
// arrive within 2 s and fit 8 KiB (else 431), its answer be read within 2 s.
//
// Thread-safety: Start/Stop from one thread; `render` is called on the
// server's thread and must be thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"

namespace tessera::cluster {

// A sample's value as the exposition format writes it: the shortest text
// that reads back as the same double, NaN, +Inf, -Inf.
std::string PrometheusValue(double value);
// A label's value between its quotes: backslash, double quote and line
// feed escaped.
std::string PrometheusLabel(std::string_view value);

class MetricsHttpServer {
 public:
  static constexpr int kMaxConnections = 64;
  explicit MetricsHttpServer(std::function<std::string()> render);
  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds host:port (port 0: the OS picks) and serves; returns the port.
  [[nodiscard]] absl::StatusOr<int> Start(const std::string& host, int port);
  void Stop();

  struct State;  // (the server's asio state, opaque)

 private:
  std::function<std::string()> render_;
  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace tessera::cluster
