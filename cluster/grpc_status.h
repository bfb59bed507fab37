#pragma once
// The one place where grpc::Status and absl::Status meet: the two share their
// code numbers (both follow google.rpc.Code).

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tessera::cluster {

[[nodiscard]] absl::Status ToAbsl(const grpc::Status& status);
[[nodiscard]] grpc::Status ToGrpc(const absl::Status& status);

// Why a call did not reach a daemon (UNAVAILABLE, DEADLINE_EXCEEDED), in
// words, from gRPC's transport text ("failed to connect to all addresses;
// last error: UNKNOWN: ipv4:...: Failed to connect to remote host:
// Connection refused", OpenSSL's error codes); nullopt when the status
// says nothing of that kind (a daemon's own answer). `tls_flags`: the
// caller's flags that set its TLS, for the advice ("--tls-ca").
struct Unreachable {
  std::string why;
  bool tls_mismatch = false;  // the two ends disagree on TLS: no retry mends it
};
[[nodiscard]] std::optional<Unreachable> DescribeUnreachable(const absl::Status& status, bool dialled_with_tls,
                                                             std::string_view tls_flags);

}  // namespace tessera::cluster
