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

}  // namespace tessera::cluster
