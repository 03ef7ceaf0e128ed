#include "proto/credentials.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace conveyor::proto {
namespace {

absl::Status CheckPair(const TlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both or neither");
  }
  return absl::OkStatus();
}

// The files, checked (CheckTlsFiles) and then read for gRPC.
absl::StatusOr<TlsFilesReport> Check(const TlsFiles& files, TlsRole role,
                                     TlsFilesReport* report) {
  ASSIGN_OR_RETURN(
      TlsFilesReport checked,
      CheckTlsFiles(files, role, absl::ToUnixSeconds(absl::Now())));
  if (report != nullptr) *report = checked;
  return checked;
}

// Read again after the check, which read it: a file replaced in between
// fails the handshake, as any bad file did before the check.
std::string Pem(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFile(path, 1 << 20);
  return pem.ok() ? *std::move(pem) : std::string();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files, TlsFilesReport* report) {
  if (!files.any()) return grpc::InsecureServerCredentials();
  RETURN_IF_ERROR(CheckPair(files));
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca on the coordinator checks client certificates, which needs "
        "TLS: give --tls-cert and --tls-key too");
  }
  RETURN_IF_ERROR(Check(files, TlsRole::kServer, report).status());
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({Pem(files.key), Pem(files.cert)});
  if (!files.ca.empty()) {
    options.pem_root_certs = Pem(files.ca);
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& files, TlsFilesReport* report) {
  if (!files.any()) return grpc::InsecureChannelCredentials();
  RETURN_IF_ERROR(CheckPair(files));
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls-ca, the CA that signed the coordinator's "
        "certificate");
  }
  RETURN_IF_ERROR(Check(files, TlsRole::kClient, report).status());
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = Pem(files.ca);
  if (!files.cert.empty()) {
    options.pem_cert_chain = Pem(files.cert);
    options.pem_private_key = Pem(files.key);
  }
  return grpc::SslCredentials(options);
}

}  // namespace conveyor::proto
