#include "proto/credentials.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace conveyor::proto {
namespace {

// Certificates and keys are a few KiB; a chain of a few certificates fits.
constexpr uint64_t kMaxPemBytes = 1 << 20;

absl::StatusOr<std::string> ReadPem(absl::string_view flag,
                                    const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFile(path, kMaxPemBytes);
  if (!pem.ok()) {
    return absl::Status(pem.status().code(),
                        absl::StrCat(flag, ": ", pem.status().message()));
  }
  // gRPC would only say "handshake failed" much later; say what is wrong now.
  if (!absl::StrContains(*pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return pem;
}

absl::Status CheckPair(const TlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both or neither");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (!files.any()) return grpc::InsecureServerCredentials();
  RETURN_IF_ERROR(CheckPair(files));
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca on the coordinator checks client certificates, which needs "
        "TLS: give --tls-cert and --tls-key too");
  }
  grpc::SslServerCredentialsOptions options;
  ASSIGN_OR_RETURN(std::string cert, ReadPem("--tls-cert", files.cert));
  ASSIGN_OR_RETURN(std::string key, ReadPem("--tls-key", files.key));
  options.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  if (!files.ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("--tls-ca", files.ca));
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& files) {
  if (!files.any()) return grpc::InsecureChannelCredentials();
  RETURN_IF_ERROR(CheckPair(files));
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls-ca, the CA that signed the coordinator's "
        "certificate");
  }
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("--tls-ca", files.ca));
  if (!files.cert.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPem("--tls-cert", files.cert));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadPem("--tls-key", files.key));
  }
  return grpc::SslCredentials(options);
}

}  // namespace conveyor::proto
