#include "cluster/grpc_status.h"

#include <string>

namespace tessera::cluster {

absl::Status ToAbsl(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (!status.error_message().empty()) return absl::Status(code, status.error_message());
  // gRPC's own answers may carry no text (a call to a server that does not
  // serve it: a master's address that is a worker's); the error still says
  // something.
  std::string message = absl::StatusCodeToString(code);
  if (code == absl::StatusCode::kUnimplemented)
    message += ": the server does not serve this call (the wrong daemon's address?)";
  return absl::Status(code, message);
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

std::optional<Unreachable> DescribeUnreachable(const absl::Status& status, bool dialled_with_tls,
                                               std::string_view tls_flags) {
  if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status)) return std::nullopt;
  const std::string text(status.message());
  const auto has = [&](std::string_view part) { return text.find(part) != std::string::npos; };
  if (has("Connection refused")) {
    return Unreachable{"nothing listens there (is `tessera master` running at that address?)"};
  }
  if (has("wrong version number")) {
    return Unreachable{"the TLS handshake failed: it serves no TLS (leave out " + std::string(tls_flags) + ")", true};
  }
  if (has("certificate verify failed")) {
    return Unreachable{"the TLS handshake failed: its certificate is not one --tls-ca verifies", true};
  }
  if (has("http1.x server")) return Unreachable{"an HTTP/1 server answers there, not the master (the metrics port?)"};
  if (has("Socket closed") && !dialled_with_tls) {
    return Unreachable{"the connection was closed (a master serving TLS dialled without " + std::string(tls_flags) +
                           ", or one that went away)",
                       true};
  }
  // (A master that stopped answering mid-watch: gRPC's keepalive gives up.)
  if (has("keepalive watchdog timeout")) {
    return Unreachable{"it stopped answering (keepalive timed out: a master stopped, hung or cut off)"};
  }
  if (has("SETTINGS frame") || (absl::IsDeadlineExceeded(status) && has("Deadline Exceeded"))) {
    return Unreachable{"no answer in time (a master stopped or overloaded, or another kind of server)"};
  }
  if (has("failed to connect to all addresses") || has("DNS resolution failed")) return Unreachable{text};
  return std::nullopt;
}

}  // namespace tessera::cluster
