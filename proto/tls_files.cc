#include "proto/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"

namespace conveyor::proto {
namespace {

// Certificates and keys are a few KiB; a CA bundle of a few hundred fits.
constexpr uint64_t kMaxPemBytes = 1 << 20;

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;

// Never prompts: an encrypted key has no one to type its passphrase.
int NoPassphrase(char*, int, int, void*) { return -1; }

absl::Status Bad(absl::string_view flag, const std::string& path,
                 absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": ", what));
}

absl::StatusOr<std::string> Read(absl::string_view flag,
                                 const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFile(path, kMaxPemBytes);
  if (!pem.ok()) {
    // A flag that names a file that cannot be used is bad configuration.
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", pem.status().message()));
  }
  return pem;
}

BioPtr MemoryBio(const std::string& bytes) {
  return BioPtr(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

// Every certificate in `pem`, in order.
std::vector<X509Ptr> Certificates(const std::string& pem) {
  std::vector<X509Ptr> out;
  BioPtr bio = MemoryBio(pem);
  while (bio != nullptr) {
    X509* cert = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr);
    if (cert == nullptr) break;
    out.emplace_back(cert);
  }
  ERR_clear_error();  // The end of the file reads as an error.
  return out;
}

std::optional<int64_t> UnixTime(const ASN1_TIME* time) {
  std::tm tm{};
  if (time == nullptr || ASN1_TIME_to_tm(time, &tm) != 1) return std::nullopt;
  return static_cast<int64_t>(timegm(&tm));
}

std::string Subject(X509* cert) {
  char buffer[256] = {};
  X509_NAME_oneline(X509_get_subject_name(cert), buffer, sizeof buffer);
  std::string subject(buffer);
  if (!subject.empty() && subject.front() == '/') subject.erase(0, 1);
  return subject;
}

// The dates of `cert`, checked at `now`; adds it to the report.
absl::Status CheckDates(absl::string_view flag, const std::string& path,
                        X509* cert, int64_t now, TlsFilesReport& report) {
  const std::string subject = Subject(cert);
  const std::optional<int64_t> not_before = UnixTime(X509_get0_notBefore(cert));
  const std::optional<int64_t> not_after = UnixTime(X509_get0_notAfter(cert));
  if (!not_before.has_value() || !not_after.has_value()) {
    return Bad(flag, path,
               absl::StrCat("the certificate ", subject,
                            " has validity dates that cannot be read"));
  }
  if (*not_after < now) {
    return Bad(flag, path,
               absl::StrCat("the certificate ", subject, " expired on ",
                            FormatUnixTime(*not_after), "; issue a new one"));
  }
  if (*not_before > now) {
    return Bad(flag, path,
               absl::StrCat("the certificate ", subject, " is not valid until ",
                            FormatUnixTime(*not_before),
                            " (is this machine's clock right?)"));
  }
  report.certificates.push_back({std::string(flag), path, subject, *not_after});
  if (*not_after - now < kExpiryWarningDays * 86400) {
    report.warnings.push_back(absl::StrCat(
        flag, " ", path, ": the certificate ", subject, " expires on ",
        FormatUnixTime(*not_after), ", in ", (*not_after - now) / 86400,
        " day(s); renew it before then"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string FormatUnixTime(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return absl::StrFormat("%04d-%02d-%02d %02d:%02d:%02d UTC", tm.tm_year + 1900,
                         tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                         tm.tm_sec);
}

absl::StatusOr<TlsFilesReport> CheckTlsFiles(const TlsFiles& files,
                                             TlsRole role, int64_t now_unix) {
  TlsFilesReport report;
  X509Ptr cert;
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> pem = Read("--tls-cert", files.cert);
    if (!pem.ok()) return pem.status();
    std::vector<X509Ptr> chain = Certificates(*pem);
    if (chain.empty()) {
      return Bad("--tls-cert", files.cert, "no PEM certificate in it");
    }
    report.cert_pem = *std::move(pem);
    cert = std::move(chain.front());
    if (absl::Status s =
            CheckDates("--tls-cert", files.cert, cert.get(), now_unix, report);
        !s.ok()) {
      return s;
    }
    if (role == TlsRole::kServer) {
      auto* names = static_cast<GENERAL_NAMES*>(
          X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
      const bool has_names = names != nullptr && sk_GENERAL_NAME_num(names) > 0;
      GENERAL_NAMES_free(names);
      if (!has_names) {
        return Bad("--tls-cert", files.cert,
                   absl::StrCat("the certificate ", Subject(cert.get()),
                                " has no subjectAltName, and clients check "
                                "the address they dial against it; issue it "
                                "with subjectAltName = IP:<address>, "
                                "DNS:<name>"));
      }
    }
  }
  if (!files.key.empty()) {
    absl::StatusOr<std::string> pem = Read("--tls-key", files.key);
    if (!pem.ok()) return pem.status();
    BioPtr bio = MemoryBio(*pem);
    KeyPtr key(bio == nullptr ? nullptr
                              : PEM_read_bio_PrivateKey(bio.get(), nullptr,
                                                        NoPassphrase, nullptr));
    ERR_clear_error();
    if (key == nullptr) {
      return Bad("--tls-key", files.key,
                 "no PEM private key in it (an encrypted key is refused: "
                 "nothing can type its passphrase; decrypt it with `openssl "
                 "pkey`)");
    }
    report.key_pem = *std::move(pem);
    if (cert != nullptr && X509_check_private_key(cert.get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-key ", files.key,
                       " does not belong to --tls-cert ", files.cert,
                       " (the certificate holds another public key); give the "
                       "key the certificate was issued for"));
    }
  }
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> pem = Read("--tls-ca", files.ca);
    if (!pem.ok()) return pem.status();
    std::vector<X509Ptr> cas = Certificates(*pem);
    if (cas.empty()) {
      return Bad("--tls-ca", files.ca, "no PEM certificate in it");
    }
    report.ca_pem = *std::move(pem);
    for (const X509Ptr& ca : cas) {
      if (absl::Status s =
              CheckDates("--tls-ca", files.ca, ca.get(), now_unix, report);
          !s.ok()) {
        return s;
      }
    }
  }
  return report;
}

}  // namespace conveyor::proto
