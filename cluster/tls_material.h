#pragma once
// TLS material (PEM text, not paths) checked with OpenSSL the way gRPC
// will read it, so that what gRPC cannot use is a one-line error naming
// what is wrong before a daemon serves or a client dials (gRPC failed every
// call with "empty address list" instead).
//
// Thread-safety: all functions are thread-safe (OpenSSL's error queue is
// per thread).

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tessera::cluster {

// One or more X.509 certificates (a CA bundle, or a certificate and its
// chain; "TRUSTED CERTIFICATE" blocks too, which gRPC reads as
// certificates); blocks of other kinds between them are skipped, as gRPC
// does.
// The error names the certificate (counted from 1) and OpenSSL's reasons.
[[nodiscard]] absl::Status CheckCertificatesPem(std::string_view pem);

// What a client or a server trusts (security.tls_ca): CheckCertificatesPem,
// and at least one of them valid now (a bundle of only expired ones fails
// every handshake).
[[nodiscard]] absl::Status CheckCaCertificatesPem(std::string_view pem);

// A private key (PKCS#8 or traditional RSA / EC), not encrypted: gRPC
// reads keys without a passphrase.
[[nodiscard]] absl::Status CheckPrivateKeyPem(std::string_view pem);

// What a server serves with: `key_pem` is the private key of the first
// certificate of `certificate_pem`, and that certificate is valid now.
// Run the checks above first: this one names no fault of either alone.
[[nodiscard]] absl::Status CheckServedPair(std::string_view certificate_pem, std::string_view key_pem);

// What a server serving the first certificate of `certificate_pem` should
// be told at start, though it may serve: a certificate without a
// subjectAltName, which a gRPC client dialling by IP address refuses
// ("Peer name ... is not in peer certificate": an address is matched only
// against subjectAltName, a host name also against the common name).
// nullopt when there is nothing to say (or it cannot be read).
[[nodiscard]] std::optional<std::string> ServedCertificateNote(std::string_view certificate_pem);

}  // namespace tessera::cluster
