#include "cluster/tls_material.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace tessera::cluster {

namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

// Larger than any certificate bundle; BIO_new_mem_buf takes an int.
constexpr size_t kMaxPemBytes = 64 << 20;

BioPtr ReadOnlyBio(std::string_view pem) { return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

// The reasons on this thread's OpenSSL error queue, oldest first, without
// the generic wrappers ("ASN1 lib", "nested asn1 error"); the queue is
// emptied.
struct Reasons {
  std::vector<std::string> texts;
  bool only_no_start_line = true;  // the end of the input reached, no other error
};
Reasons TakeReasons() {
  Reasons reasons;
  for (unsigned long error = ERR_get_error(); error != 0; error = ERR_get_error()) {
    const bool no_start = ERR_GET_LIB(error) == ERR_LIB_PEM && ERR_GET_REASON(error) == PEM_R_NO_START_LINE;
    if (!no_start) reasons.only_no_start_line = false;
    const char* text = ERR_reason_error_string(error);
    const std::string reason = text != nullptr ? text : absl::StrCat("error ", error);
    if (reason == "ASN1 lib" || reason == "nested asn1 error") continue;
    if (std::find(reasons.texts.begin(), reasons.texts.end(), reason) == reasons.texts.end()) {
      reasons.texts.push_back(reason);
    }
  }
  return reasons;
}

absl::Status CheckSize(std::string_view pem) {
  if (pem.size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("holds ", pem.size(), " bytes, more than PEM material can (", kMaxPemBytes, ")"));
  }
  return absl::OkStatus();
}

std::string ShownTime(const ASN1_TIME* time) {
  std::tm parts{};
  if (ASN1_TIME_to_tm(time, &parts) != 1) return "an unreadable time";
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &parts);
  return text;
}

int RefusePassphrase(char* /*buffer*/, int /*size*/, int /*writing*/, void* asked) {
  *static_cast<bool*>(asked) = true;
  return -1;
}

}  // namespace

absl::Status CheckCertificatesPem(std::string_view pem) {
  RETURN_IF_ERROR(CheckSize(pem));
  ERR_clear_error();
  BioPtr bio = ReadOnlyBio(pem);
  int count = 0;
  while (X509Ptr(PEM_read_bio_X509_AUX(bio.get(), nullptr, nullptr, nullptr)) != nullptr) ++count;
  const Reasons reasons = TakeReasons();
  if (reasons.only_no_start_line) {
    if (count > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "holds no CERTIFICATE block",
        pem.find("PRIVATE KEY-----") != std::string_view::npos ? " (a private key's file given for it?)" : ""));
  }
  return absl::InvalidArgumentError(absl::StrCat("certificate ", count + 1,
                                                 " cannot be read (OpenSSL: ", absl::StrJoin(reasons.texts, ", "),
                                                 "): is the file cut short, or is that block no certificate?"));
}

absl::Status CheckCaCertificatesPem(std::string_view pem) {
  RETURN_IF_ERROR(CheckCertificatesPem(pem));
  BioPtr bio = ReadOnlyBio(pem);
  int count = 0;
  X509Ptr latest_expired, earliest_coming;
  for (X509Ptr cert(PEM_read_bio_X509_AUX(bio.get(), nullptr, nullptr, nullptr)); cert != nullptr;
       cert.reset(PEM_read_bio_X509_AUX(bio.get(), nullptr, nullptr, nullptr))) {
    ++count;
    const ASN1_TIME* not_after = X509_get0_notAfter(cert.get());
    const ASN1_TIME* not_before = X509_get0_notBefore(cert.get());
    if (X509_cmp_current_time(not_after) < 0) {
      if (latest_expired == nullptr || ASN1_TIME_compare(not_after, X509_get0_notAfter(latest_expired.get())) > 0) {
        latest_expired = std::move(cert);
      }
    } else if (X509_cmp_current_time(not_before) > 0) {
      if (earliest_coming == nullptr || ASN1_TIME_compare(not_before, X509_get0_notBefore(earliest_coming.get())) < 0) {
        earliest_coming = std::move(cert);
      }
    } else {
      TakeReasons();
      return absl::OkStatus();  // one valid now
    }
  }
  TakeReasons();
  std::vector<std::string> why;
  if (latest_expired != nullptr) {
    why.push_back(absl::StrCat(earliest_coming == nullptr && count > 1 ? "the last expired on " : "expired on ",
                               ShownTime(X509_get0_notAfter(latest_expired.get()))));
  }
  if (earliest_coming != nullptr) {
    why.push_back(absl::StrCat("valid only from ", ShownTime(X509_get0_notBefore(earliest_coming.get())),
                               " (is this machine's clock right?)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(count == 1 ? "its certificate is not valid now: "
                              : absl::StrCat("none of its ", count, " certificates is valid now: "),
                   absl::StrJoin(why, "; "), "; no peer can be verified with it"));
}

absl::Status CheckPrivateKeyPem(std::string_view pem) {
  RETURN_IF_ERROR(CheckSize(pem));
  ERR_clear_error();
  // The key's PEM block first (OpenSSL's decoders report a block cut
  // short or not base64 only as "unsupported").
  {
    BioPtr bio = ReadOnlyBio(pem);
    bool found = false;
    while (!found) {
      char* name = nullptr;
      char* header = nullptr;
      unsigned char* data = nullptr;
      long length = 0;
      if (PEM_read_bio(bio.get(), &name, &header, &data, &length) != 1) break;
      found = std::string_view(name).ends_with("PRIVATE KEY");
      OPENSSL_free(name);
      OPENSSL_free(header);
      OPENSSL_free(data);
    }
    const Reasons reasons = TakeReasons();
    if (!found && reasons.only_no_start_line) {
      return absl::InvalidArgumentError(absl::StrCat(
          "holds no PRIVATE KEY block",
          pem.find("CERTIFICATE-----") != std::string_view::npos ? " (a certificate's file given for it?)" : ""));
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "its PEM cannot be read (OpenSSL: ", absl::StrJoin(reasons.texts, ", "), "): is the file cut short?"));
    }
  }
  BioPtr bio = ReadOnlyBio(pem);
  bool asked = false;
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, RefusePassphrase, &asked));
  const Reasons reasons = TakeReasons();
  if (key != nullptr) return absl::OkStatus();
  if (asked) {
    return absl::InvalidArgumentError(
        "the private key is encrypted, and gRPC reads keys without a passphrase: decrypt it "
        "(openssl pkey -in KEY -out PLAIN) and keep that file readable by this user only");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "its PRIVATE KEY block is no key OpenSSL can read (OpenSSL: ", absl::StrJoin(reasons.texts, ", "), ")"));
}

absl::Status CheckServedPair(std::string_view certificate_pem, std::string_view key_pem) {
  // (Each was checked by itself already: the CLI reads, then the daemon
  // starts; this reads them once more, not the whole check again.)
  RETURN_IF_ERROR(CheckSize(certificate_pem));
  RETURN_IF_ERROR(CheckSize(key_pem));
  BioPtr cert_bio = ReadOnlyBio(certificate_pem);
  X509Ptr cert(PEM_read_bio_X509_AUX(cert_bio.get(), nullptr, nullptr, nullptr));
  BioPtr key_bio = ReadOnlyBio(key_pem);
  bool asked = false;
  KeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, RefusePassphrase, &asked));
  if (cert == nullptr || key == nullptr) {
    TakeReasons();
    return absl::InvalidArgumentError(
        "the certificate or the private key cannot be read (CheckCertificatesPem and CheckPrivateKeyPem say why)");
  }
  const bool match = X509_check_private_key(cert.get(), key.get()) == 1;
  TakeReasons();
  if (!match) return absl::InvalidArgumentError("the private key is not the key of the (first) certificate");
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the certificate expired on ", ShownTime(X509_get0_notAfter(cert.get()))));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
    return absl::InvalidArgumentError(absl::StrCat("the certificate is valid only from ",
                                                   ShownTime(X509_get0_notBefore(cert.get())),
                                                   " (is this machine's clock right?)"));
  }
  return absl::OkStatus();
}

std::optional<std::string> ServedCertificateNote(std::string_view certificate_pem) {
  if (CheckSize(certificate_pem).ok()) {
    BioPtr bio = ReadOnlyBio(certificate_pem);
    X509Ptr cert(PEM_read_bio_X509_AUX(bio.get(), nullptr, nullptr, nullptr));
    const bool has_names = cert == nullptr || X509_get_ext_by_NID(cert.get(), NID_subject_alt_name, -1) >= 0;
    TakeReasons();
    if (!has_names) {
      return "the TLS certificate has no subjectAltName: a gRPC client dialling this daemon by IP address "
             "refuses it ('Peer name ... is not in peer certificate'; only a host name is matched against the "
             "common name); make it with e.g. -addext subjectAltName=IP:ADDRESS,DNS:HOST";
    }
  }
  return std::nullopt;
}

}  // namespace tessera::cluster
