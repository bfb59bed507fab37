#pragma once
// How the daemons and clients talk: the shared token and TLS material, the
// server credentials and client channels made from them, and the token check
// every RPC handler of both services starts with.
//
// Thread-safety: all functions are thread-safe; Security is a value.

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"

namespace tessera::cluster {

// Largest message either service accepts or sends (plans included).
inline constexpr int kMaxMessageBytes = 64 << 20;

struct Security {
  std::string token;  // empty: no authentication
  // PEM contents (not paths). Server side: cert + key turn TLS on. Client
  // side: ca (the roots that sign the server's cert) turns TLS on.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  // Client side: the name the server's certificate must carry, when it is
  // not the host in the address.
  std::string tls_server_name;
};

// Whether `id` is a worker or job id: 1-128 characters of [A-Za-z0-9._-].
[[nodiscard]] bool IsPlainId(std::string_view id);

// gRPC's own log lines (it prints errors on stderr, several lines each) go
// to Tessera's log at debug level instead: the CLI's errors stay one line.
void RouteGrpcLogs();

// Whether `token` can travel as the header value "Bearer <token>": printable
// ASCII without spaces (gRPC aborts the process on any other byte), at most
// kMaxTokenBytes (gRPC's 8 KiB of metadata per call hold it). The error
// names the first bad byte and its offset.
inline constexpr size_t kMaxTokenBytes = 4096;
[[nodiscard]] absl::Status CheckTokenText(std::string_view token);
// `security` as the daemons and the client take it: a token CheckTokenText
// accepts (or none); TLS material OpenSSL reads as gRPC will
// (cluster/tls_material.h): certificates, an unencrypted private key that is
// the key of the certificate, which is valid now. Errors name the field.
[[nodiscard]] absl::Status CheckSecurity(const Security& security);

// OK when every (name, value) of an embedding program's options is a finite
// duration > 0; else InvalidArgument naming the first that is not.
[[nodiscard]] absl::Status CheckDurations(std::initializer_list<std::pair<const char*, absl::Duration>> durations);

// What a secret file holds. A token loses its surrounding whitespace and
// must then be printable ASCII without spaces (it travels as a header
// value); certificates (a certificate and its chain; a CA bundle, of which
// one must be valid now) and a private key are PEM that OpenSSL reads
// (cluster/tls_material.h).
enum class SecretKind { kToken, kCertificates, kCaCertificates, kPrivateKey };
// Reads a file's contents (for --token-file, --tls-*), checked as `kind`.
// One-line errors naming the file.
[[nodiscard]] absl::StatusOr<std::string> ReadSecretFile(const std::string& path, SecretKind kind);

// Whether `address` is HOST:PORT (an IPv6 host in brackets) with a port in
// [0, 65535] (gRPC would wrap 99999 to 34463, and dial 443 without one);
// without `port_required`, HOST alone too. In gRPC's own schemes, what
// follows dns:[//AUTHORITY/], ipv4: and ipv6: (each of a comma list, a
// literal address of the family) is checked so; unix:, unix-abstract: and
// vsock: need something after them. The error quotes the address.
[[nodiscard]] absl::Status CheckAddress(const std::string& address, bool port_required = true);
// A worker's data-plane host (`--data-address`): an address as above
// without a port (gloo listens on ports it picks: a port given was checked,
// then not used); an IPv6 host in brackets or not.
[[nodiscard]] absl::Status CheckDataHost(const std::string& address);
// The host of a data address for gloo to listen on: without brackets.
std::string DataHostName(const std::string& address);
// The address to dial a daemon at that registered `address` (HOST:PORT) from
// `peer` (its call's peer as gRPC names it: "ipv4:10.0.0.5:40312",
// "ipv6:[fd00::5]:40312"): an unspecified host (0.0.0.0, [::], a worker
// listening on every interface) is the peer's IP, the port kept; any other
// address as it is.
std::string DialableAddress(const std::string& address, const std::string& peer);
// Whether this machine can listen on HOST[:PORT]'s host (a worker's data
// plane: gloo and the actor bus listen there): it resolves and a TCP socket
// binds to it (on the port, or any). FAILED_PRECONDITION naming the address
// and why not (a host of another machine, one that does not resolve).
[[nodiscard]] absl::Status CheckListenable(const std::string& address);

[[nodiscard]] std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const Security& security);
// A channel to a daemon. Where a call is in flight, it pings the server
// after `keepalive` without traffic and drops the connection when no answer
// comes within `keepalive` more (a stopped or partitioned peer: the call
// ends UNAVAILABLE instead of waiting for TCP's hours).
[[nodiscard]] std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const Security& security,
                                                         absl::Duration keepalive = absl::Seconds(20));

// The threads a server runs calls on, at most (see Serve).
inline constexpr int kMaxServerThreads = 4096;

// A gRPC server bound to `listen` ("host:port"; port 0: the OS picks)
// serving `service` with `security`'s credentials and kMaxMessageBytes, and
// the address it bound ("host:<port>"); it accepts keepalive pings every
// second or slower. `what` names the daemon in the error; an address
// CheckAddress refuses is INVALID_ARGUMENT.
struct Served {
  std::unique_ptr<grpc::Server> server;
  std::string address;
};
[[nodiscard]] absl::StatusOr<Served> Serve(const std::string& listen, const Security& security, grpc::Service* service,
                                           const std::string& what);

// Sets the token and a deadline on an outgoing call.
void PrepareContext(grpc::ClientContext& context, const Security& security, absl::Duration timeout);

// OK, or UNAUTHENTICATED when the daemon has a token and the call does not
// carry `authorization: Bearer <token>`.
[[nodiscard]] grpc::Status CheckToken(const grpc::ServerContext& context, const std::string& token);

}  // namespace tessera::cluster
