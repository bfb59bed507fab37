#include "cluster/transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cluster/tls_material.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/strings.h"
#include "grpc/support/log.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/support/channel_arguments.h"

namespace tessera::cluster {

namespace {

void GrpcLogToDebug(gpr_log_func_args* args) {
  TLOG_DEBUG("grpc {}:{}: {}", args->file != nullptr ? args->file : "?", args->line,
             args->message != nullptr ? args->message : "");
}

}  // namespace

void RouteGrpcLogs() { gpr_set_log_function(GrpcLogToDebug); }

bool IsPlainId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

absl::Status CheckTokenText(std::string_view token) {
  // gRPC's metadata limit is 8 KiB per call, the token's header among them.
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a token is at most ", kMaxTokenBytes, " bytes, this one has ",
                                                   token.size(), "; e.g. head -c 32 /dev/urandom | base64"));
  }
  // It travels as an HTTP/2 header value ("Bearer <token>"), which gRPC
  // aborts the process on unless it is printable ASCII.
  for (size_t i = 0; i < token.size(); ++i) {
    const auto c = static_cast<unsigned char>(token[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat("a token must be printable ASCII without spaces (byte 0x",
                                                     absl::Hex(c, absl::kZeroPad2), " at offset ", i,
                                                     "); e.g. head -c 32 /dev/urandom | base64"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSecurity(const Security& security) {
  if (absl::Status status = CheckTokenText(security.token); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("security.token: ", status.message()));
  }
  for (const auto& [name, pem] : {std::pair<const char*, const std::string*>{"tls_cert", &security.tls_cert},
                                  {"tls_key", &security.tls_key},
                                  {"tls_ca", &security.tls_ca}}) {
    if (!pem->empty() && pem->find("-----BEGIN ") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("security.", name, " holds no PEM block (-----BEGIN ...): give the contents, not a path"));
    }
  }
  if (security.tls_cert.empty() != security.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "security.tls_cert and security.tls_key go together (one alone would serve without TLS)");
  }
  // What gRPC cannot read failed every call with "empty address list".
  if (!security.tls_cert.empty()) {
    if (absl::Status status = CheckCertificatesPem(security.tls_cert); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("security.tls_cert: ", status.message()));
    }
    if (absl::Status status = CheckPrivateKeyPem(security.tls_key); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("security.tls_key: ", status.message()));
    }
    if (absl::Status status = CheckServedPair(security.tls_cert, security.tls_key); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("security.tls_cert and security.tls_key: ", status.message()));
    }
  }
  if (!security.tls_ca.empty()) {
    if (absl::Status status = CheckCaCertificatesPem(security.tls_ca); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("security.tls_ca: ", status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDurations(std::initializer_list<std::pair<const char*, absl::Duration>> durations) {
  for (const auto& [name, value] : durations) {
    if (value <= absl::ZeroDuration() || value == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " ", absl::FormatDuration(value), " must be a finite duration > 0"));
    }
  }
  return absl::OkStatus();
}

namespace {
// A token file (a token of at most kMaxTokenBytes, and whitespace), and a
// PEM file (a CA bundle of a few hundred certificates is under 1 MiB).
constexpr std::uintmax_t kMaxSecretFileBytes = 1 << 20;
constexpr std::uintmax_t kMaxPemFileBytes = 16 << 20;
}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, SecretKind kind) {
  const bool trim = kind == SecretKind::kToken;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is a directory"));
  // Only a regular file, of a secret's size: /dev/zero was read without
  // end (gigabytes), a FIFO waited on for ever.
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "': no such file"));
  }
  absl::StatusOr<std::string> read = ReadWholeFile(path, trim ? kMaxSecretFileBytes : kMaxPemFileBytes);
  if (!read.ok()) return absl::Status(read.status().code(), read.status().message());
  std::string contents = *std::move(read);
  if (trim) contents = std::string(absl::StripAsciiWhitespace(contents));
  if (contents.empty()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' is empty"));
  if (trim) {
    if (absl::Status status = CheckTokenText(contents); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", status.message()));
    }
  } else if (contents.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' holds no PEM block (-----BEGIN ...)"));
  } else if (absl::Status status = kind == SecretKind::kPrivateKey       ? CheckPrivateKeyPem(contents)
                                   : kind == SecretKind::kCaCertificates ? CheckCaCertificatesPem(contents)
                                                                         : CheckCertificatesPem(contents);
             !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", status.message()));
  }
  return contents;
}

absl::Status CheckListenable(const std::string& address) {
  std::string host = address, port = "0";
  if (address.starts_with("[")) {
    const size_t close = address.find(']');
    host = address.substr(1, close == std::string::npos ? std::string::npos : close - 1);
    if (close != std::string::npos && close + 1 < address.size()) port = address.substr(close + 2);
  } else if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  const std::string shown = EscapeControlChars(address, /*non_ascii=*/true);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); error != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", shown, "': cannot resolve its host (", ::gai_strerror(error), ")"));
  }
  std::string why = "no address";
  bool bound = false;
  for (const addrinfo* a = found; a != nullptr && !bound; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!bound) why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (!bound) {
    return absl::FailedPreconditionError(absl::StrCat("'", shown, "': this machine cannot listen there (", why, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckDataHost(const std::string& address) {
  // Every interface is no address to dial: the job's other workers dial
  // this one as given (0.0.0.0 reached only their own machine).
  in6_addr v6{};
  in_addr v4{};
  const std::string bare = DataHostName(address);
  if ((::inet_pton(AF_INET6, bare.c_str(), &v6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&v6)) ||
      (::inet_pton(AF_INET, bare.c_str(), &v4) == 1 && v4.s_addr == INADDR_ANY)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", EscapeControlChars(address, /*non_ascii=*/true),
                     "' is every interface, not an address the job's other workers can dial: give this machine's "
                     "own (its IP or host name; 127.0.0.1, the default, on one machine)"));
  }
  // (A bare IPv6 address is a host: its colons are no port.)
  if (::inet_pton(AF_INET6, address.c_str(), &v6) == 1) return absl::OkStatus();
  RETURN_IF_ERROR(CheckAddress(address, /*port_required=*/false));
  const bool bracketed = address.starts_with("[");
  const bool has_port = bracketed ? !address.ends_with("]") : address.find(':') != std::string::npos;
  if (has_port) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", EscapeControlChars(address, /*non_ascii=*/true),
                     "': a host only (gloo listens there on ports it picks; a port would not be used)"));
  }
  return absl::OkStatus();
}

std::string DataHostName(const std::string& address) {
  if (address.starts_with("[") && address.ends_with("]")) return address.substr(1, address.size() - 2);
  return address;
}

std::string DialableAddress(const std::string& address, const std::string& peer) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  const std::string_view host = std::string_view(address).substr(0, colon);
  if (host != "0.0.0.0" && host != "[::]" && host != "[0:0:0:0:0:0:0:0]") return address;
  std::string_view ip;
  if (peer.starts_with("ipv4:")) {
    ip = std::string_view(peer).substr(5);
    ip = ip.substr(0, ip.rfind(':'));  // "10.0.0.5"
  } else if (peer.starts_with("ipv6:")) {
    ip = std::string_view(peer).substr(5);
    ip = ip.substr(0, ip.rfind(':'));  // "[fd00::5]", or URI-encoded "%5Bfd00::5%5D"
    if (ip.starts_with("%5B") && ip.ends_with("%5D") && ip.size() > 6) {
      return absl::StrCat("[", std::string(ip.substr(3, ip.size() - 6)), "]", address.substr(colon));
    }
    if (!ip.starts_with("[") || !ip.ends_with("]")) return address;
  } else {
    return address;
  }
  if (ip.empty()) return address;
  return absl::StrCat(std::string(ip), address.substr(colon));
}

absl::Status CheckAddress(const std::string& address, bool port_required) {
  // gRPC's own schemes (unix:, dns:///, ipv4:, ...) are left to it; another
  // scheme (http://, grpc://) it would look up as a host name.
  for (const std::string_view scheme : {"dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:"}) {
    if (!address.starts_with(scheme)) continue;
    // (gRPC said only "empty address list" of a scheme with nothing after.)
    if (address.find_first_not_of('/', scheme.size()) == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", EscapeControlChars(address, /*non_ascii=*/true), "': nothing after '", std::string(scheme),
                       "' (a ", scheme.starts_with("unix") ? "socket path" : "host and port", ")"));
    }
    // The host and port after dns:[//AUTHORITY/], ipv4: and ipv6: are
    // checked as a bare one is (gRPC took port 99999 for 34463, modulo
    // 65536, and said only "Failed to create secure client channel" of
    // ipv4:garbage).
    std::string rest = address.substr(scheme.size());
    if (scheme == "dns:" && rest.starts_with("//")) {
      const size_t slash = rest.find('/', 2);
      rest = slash == std::string::npos ? "" : rest.substr(slash + 1);
    }
    if (scheme == "dns:" || scheme == "ipv4:" || scheme == "ipv6:") {
      const std::vector<std::string> targets =
          scheme == "dns:" ? std::vector<std::string>{rest} : absl::StrSplit(rest, ',');
      for (const std::string& target : targets) {
        absl::Status checked = CheckAddress(target, port_required);
        if (checked.ok() && scheme != "dns:") {
          // A literal address of the scheme's family.
          std::string host =
              target.starts_with("[") ? target.substr(1, target.find(']') - 1) : target.substr(0, target.rfind(':'));
          if (scheme == "ipv4:" && target.find(':') == std::string::npos) host = target;
          unsigned char ip[sizeof(in6_addr)];
          if (::inet_pton(scheme == "ipv4:" ? AF_INET : AF_INET6, host.c_str(), ip) != 1) {
            checked =
                absl::InvalidArgumentError(absl::StrCat("'", EscapeControlChars(host, /*non_ascii=*/true),
                                                        "' is not an IPv", scheme == "ipv4:" ? "4" : "6", " address"));
          }
        }
        if (!checked.ok()) {
          // (Its words without the part's own quote: the whole is quoted.)
          std::string why(checked.message());
          const std::string quoted = absl::StrCat("'", EscapeControlChars(target, /*non_ascii=*/true), "': ");
          if (why.starts_with(quoted)) why.erase(0, quoted.size());
          return absl::InvalidArgumentError(
              absl::StrCat("'", EscapeControlChars(address, /*non_ascii=*/true), "': ", why));
        }
      }
    }
    return absl::OkStatus();
  }
  // Quoted escaped: it came from a command line.
  const std::string shown = EscapeControlChars(address, /*non_ascii=*/true);
  if (const size_t scheme = address.find("://"); scheme != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", shown, "': expected HOST:PORT, or a gRPC target (dns:///, unix:, ipv4:, ipv6:), not a '",
                     EscapeControlChars(address.substr(0, scheme), /*non_ascii=*/true), "://' URL"));
  }
  std::string_view host = address, port;
  if (address.starts_with("[")) {
    const size_t close = address.find(']');
    if (close == std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat("'", shown, "': no ']' after the IPv6 host"));
    host = std::string_view(address).substr(0, close + 1);
    const std::string_view rest = std::string_view(address).substr(close + 1);
    if (!rest.empty() && (rest[0] != ':' || rest.size() == 1)) {
      return absl::InvalidArgumentError(absl::StrCat("'", shown, "': expected HOST:PORT"));
    }
    if (!rest.empty()) port = rest.substr(1);
  } else if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    host = std::string_view(address).substr(0, colon);
    port = std::string_view(address).substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", shown, "': an IPv6 host goes in brackets, [::1]:PORT"));
    }
    if (port.empty()) return absl::InvalidArgumentError(absl::StrCat("'", shown, "': no port after ':'"));
  }
  if (host.empty() || host == "[]") return absl::InvalidArgumentError(absl::StrCat("'", shown, "': no host"));
  for (char c : host) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat("'", shown, "': the host holds a space or a non-ASCII byte"));
    }
  }
  if (port.empty()) {
    if (port_required) return absl::InvalidArgumentError(absl::StrCat("'", shown, "': no port (expected HOST:PORT)"));
    return absl::OkStatus();
  }
  // Decimal, as gRPC reads it: leading zeros do not count ("017170" is
  // 17170).
  const size_t first = std::min(port.find_first_not_of('0'), port.size() - 1);
  int value = 0;
  for (char c : port) {
    if (c < '0' || c > '9' || port.size() - first > 5) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", shown, "': port '", EscapeControlChars(port, /*non_ascii=*/true), "' is not a number in [0, 65535]"));
    }
    value = value * 10 + (c - '0');
  }
  if (value > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", shown, "': port ", value, " is not in [0, 65535]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Served> Serve(const std::string& listen, const Security& security, grpc::Service* service,
                             const std::string& what) {
  if (absl::Status status = CheckAddress(listen); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": listen address ", status.message()));
  }
  // (gRPC's servers take these schemes for dialling only.)
  for (const char* scheme : {"ipv4:", "ipv6:", "vsock:"}) {
    if (listen.starts_with(scheme)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": listen address '", listen, "': a server listens on ",
                                                     "HOST:PORT, dns:///HOST:PORT or unix:PATH, not ", scheme));
    }
  }
  // gRPC replaces a socket file that is there: a second daemon on a unix:
  // path took it from the first, which nothing new could reach. One that
  // answers is in use (a file left by a killed daemon answers no connect).
  if (listen.starts_with("unix:")) {
    std::string path = listen.substr(5);
    if (path.starts_with("//")) path = path.substr(2);
    sockaddr_un peer{};
    std::error_code unreadable;  // (exists() without it throws on a path it may not look at)
    if (path.size() < sizeof peer.sun_path && std::filesystem::exists(path, unreadable)) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      peer.sun_family = AF_UNIX;
      std::memcpy(peer.sun_path, path.data(), path.size());
      const bool answered = fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&peer), sizeof peer) == 0;
      if (fd >= 0) ::close(fd);
      if (answered) {
        return absl::UnavailableError(
            absl::StrCat(what, ": cannot listen on '", listen, "': another process serves that socket"));
      }
    }
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, ServerCredentials(security), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // gRPC binds with SO_REUSEPORT by default: a second daemon on a port in
  // use would start and share it, each call landing on either.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients' keepalive pings (MakeChannel) are welcome down to one a
  // second; gRPC's default (one per 5 minutes) would answer them GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  // Each call in progress holds a thread of the server (KvWait and WatchJob
  // for as long as they wait): a flood of calls would take threads until
  // the process could start none. Past the cap a call is answered
  // RESOURCE_EXHAUSTED (the master caps its waiting calls well below it).
  grpc::ResourceQuota quota(absl::StrCat(what, " rpc threads"));
  quota.SetMaxThreads(kMaxServerThreads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(service);
  Served served;
  served.server = builder.BuildAndStart();
  if (served.server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat(what, ": cannot listen on '", listen, "' (the port is in use, or the host is not this machine's",
                     security.tls_cert.empty() ? "" : ", or gRPC could not use the TLS certificate and key", ")"));
  }
  // A socket's path is its address (gRPC reports port 1 for it).
  served.address = listen.starts_with("unix:") || listen.starts_with("unix-abstract:")
                       ? listen
                       : absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  return served;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const Security& security) {
  if (security.tls_cert.empty() || security.tls_key.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({security.tls_key, security.tls_cert});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const Security& security,
                                           absl::Duration keepalive) {
  grpc::ChannelArguments args;
  const int keepalive_ms = static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(keepalive), 1000, INT32_MAX));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
  // Keep pinging through a long silent stream (a Watch of a quiet job):
  // gRPC otherwise stops after two pings without data.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly after a daemon restarts (the default backoff grows to
  // two minutes). The "min reconnect backoff" is the time a connection
  // attempt gets (gRPC's MIN_CONNECT_TIMEOUT): kept at gRPC's 20 s, as at
  // 100 ms a busy machine's handshakes timed out ("timed out before
  // receiving SETTINGS frame").
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (security.tls_ca.empty()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = security.tls_ca;
    credentials = grpc::SslCredentials(options);
    if (!security.tls_server_name.empty()) args.SetSslTargetNameOverride(security.tls_server_name);
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

void PrepareContext(grpc::ClientContext& context, const Security& security, absl::Duration timeout) {
  if (!security.token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", security.token));
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  }
}

grpc::Status CheckToken(const grpc::ServerContext& context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it != metadata.end()) {
    const std::string_view given(it->second.data(), it->second.size());
    const std::string expected = absl::StrCat("Bearer ", token);
    // Constant time in the token's contents.
    if (given.size() == expected.size()) {
      unsigned char diff = 0;
      for (size_t i = 0; i < given.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
      if (diff == 0) return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong token (authorization: Bearer <token>)");
}

}  // namespace tessera::cluster
