#include "proto/credentials.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

// The files, checked (CheckTlsFiles), with their text for gRPC: read once.
absl::StatusOr<TlsFilesReport> Check(const TlsFiles& files, TlsRole role,
                                     TlsFilesReport* report) {
  ASSIGN_OR_RETURN(
      TlsFilesReport checked,
      CheckTlsFiles(files, role, absl::ToUnixSeconds(absl::Now())));
  // The caller gets the validity and warnings, not another copy of the key.
  if (report != nullptr) {
    report->certificates = checked.certificates;
    report->warnings = checked.warnings;
  }
  return checked;
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
  ASSIGN_OR_RETURN(TlsFilesReport checked,
                   Check(files, TlsRole::kServer, report));
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back(
      {std::move(checked.key_pem), std::move(checked.cert_pem)});
  if (!files.ca.empty()) {
    options.pem_root_certs = std::move(checked.ca_pem);
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
  ASSIGN_OR_RETURN(TlsFilesReport checked,
                   Check(files, TlsRole::kClient, report));
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = std::move(checked.ca_pem);
  if (!files.cert.empty()) {
    options.pem_cert_chain = std::move(checked.cert_pem);
    options.pem_private_key = std::move(checked.key_pem);
  }
  return grpc::SslCredentials(options);
}

}  // namespace conveyor::proto
