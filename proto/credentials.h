// TLS for the control plane: the gRPC credentials each end uses, from the
// PEM files an operator gives with --tls-cert, --tls-key and --tls-ca.
//
//   coordinator  --tls-cert + --tls-key: serve TLS with this certificate;
//                --tls-ca as well: also require a client certificate signed
//                by this CA (mutual TLS).
//   clients      --tls-ca: use TLS and trust this CA for the coordinator's
//                certificate; --tls-cert + --tls-key as well: present this
//                client certificate (for a coordinator that requires one).
// No flags: plaintext, as before. The shared auth token
// (common/auth_token.h) is independent and may be combined with either.
// Thread-safe (pure functions).
#ifndef CONVEYOR_PROTO_CREDENTIALS_H_
#define CONVEYOR_PROTO_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace conveyor::proto {

// Paths to PEM files; empty: not given. Every field has an initializer so
// callers can name only the ones they set.
struct TlsFiles {
  std::string cert = {};
  std::string key = {};
  std::string ca = {};

  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// InvalidArgument naming the flag when only one of --tls-cert and --tls-key
// is given, when the server gets --tls-ca without a certificate, or when a
// file is empty or not PEM; the errno-derived code when one cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

// As MakeServerCredentials; a client certificate needs --tls-ca too (a
// client with TLS must know whom to trust).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& files);

}  // namespace conveyor::proto

#endif  // CONVEYOR_PROTO_CREDENTIALS_H_
