// CheckTlsFiles: what is wrong with a program's --tls-cert, --tls-key and
// --tls-ca, found at start, by reading them as gRPC would only later (and
// then report as something else: a key that does not match its certificate
// made the coordinator say "cannot listen on ... (address in use)", a worker
// retry "empty address list" forever). Every program runs it through
// MakeServerCredentials / MakeChannelCredentials (proto/credentials.h).
// Thread-safe (pure functions over files).
#ifndef CONVEYOR_PROTO_TLS_FILES_H_
#define CONVEYOR_PROTO_TLS_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::proto {

// Paths to PEM files; empty: not given. Every field has an initializer so
// callers can name only the ones they set.
struct TlsFiles {
  std::string cert = {};
  std::string key = {};
  std::string ca = {};

  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The server checks its certificate's subjectAltName (clients match the
// address they dial against it); a client does not need one.
enum class TlsRole { kServer, kClient };

// One certificate's validity, for the expiry warning and metric.
struct CertificateValidity {
  std::string flag;  // "--tls-cert" or "--tls-ca"
  std::string path;
  std::string subject;  // "CN=coordinator"
  int64_t not_after_unix = 0;
};

struct TlsFilesReport {
  // The files' PEM text as checked, for the credentials ("" when not given).
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
  // Every certificate read: --tls-cert's first, then each of --tls-ca's.
  std::vector<CertificateValidity> certificates;
  // Certificates that expire within kExpiryWarningDays: said at start.
  std::vector<std::string> warnings;
};

inline constexpr int64_t kExpiryWarningDays = 30;

// InvalidArgument naming the flag, the file and what is wrong: unreadable,
// no PEM certificate or key in it (an encrypted key is refused: nothing can
// type its passphrase), a key that does not belong to the certificate, a
// certificate or CA expired or not yet valid at `now_unix`, a server
// certificate without subjectAltName. Files not given are not checked.
absl::StatusOr<TlsFilesReport> CheckTlsFiles(const TlsFiles& files,
                                             TlsRole role, int64_t now_unix);

// "2020-01-01 00:00:00 UTC".
std::string FormatUnixTime(int64_t unix_seconds);

}  // namespace conveyor::proto

#endif  // CONVEYOR_PROTO_TLS_FILES_H_
