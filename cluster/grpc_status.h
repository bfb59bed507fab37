#pragma once
// The one place where grpc::Status and absl::Status meet: the two share their
// code numbers (both follow google.rpc.Code).

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tessera::cluster {

[[nodiscard]] absl::Status ToAbsl(const grpc::Status& status);
[[nodiscard]] grpc::Status ToGrpc(const absl::Status& status);

}  // namespace tessera::cluster
