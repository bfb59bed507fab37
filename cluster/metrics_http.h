#pragma once
// A tiny HTTP/1.0 server for Prometheus: GET /metrics answers `render()`
// (text exposition format); anything else 404. One connection at a time on
// its own thread; a request must arrive within 2 s and fit 8 KiB.
//
// Thread-safety: Start/Stop from one thread; `render` is called on the
// server's thread and must be thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace tessera::cluster {

class MetricsHttpServer {
 public:
  explicit MetricsHttpServer(std::function<std::string()> render);
  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds host:port (port 0: the OS picks) and serves; returns the port.
  [[nodiscard]] absl::StatusOr<int> Start(const std::string& host, int port);
  void Stop();

 private:
  struct State;
  std::function<std::string()> render_;
  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace tessera::cluster
