#include "cluster/transport.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace tessera::cluster {

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, bool trim) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  std::string contents = text.str();
  if (trim) contents = std::string(absl::StripAsciiWhitespace(contents));
  if (contents.empty()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' is empty"));
  return contents;
}

absl::StatusOr<Served> Serve(const std::string& listen, const Security& security, grpc::Service* service,
                             const std::string& what) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, ServerCredentials(security), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterService(service);
  Served served;
  served.server = builder.BuildAndStart();
  if (served.server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot listen on '", listen, "'"));
  }
  served.address = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  return served;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const Security& security) {
  if (security.tls_cert.empty() || security.tls_key.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({security.tls_key, security.tls_cert});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const Security& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly after a daemon restarts (the default backoff grows to
  // two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
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
