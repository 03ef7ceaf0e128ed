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
#include "proto/tls_files.h"

namespace conveyor::proto {

// InvalidArgument naming the flag when only one of --tls-cert and --tls-key
// is given, when the server gets --tls-ca without a certificate, or for
// anything CheckTlsFiles (proto/tls_files.h) finds wrong with the files:
// unreadable, not PEM, a key that is not the certificate's, expired, no
// subjectAltName. `report`, when given, receives the certificates' validity
// and the warnings for those that expire soon (not the files' text). Each
// file is read once, by the check, and what was checked is what gRPC gets.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files, TlsFilesReport* report = nullptr);

// As MakeServerCredentials; a client certificate needs --tls-ca too (a
// client with TLS must know whom to trust).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& files, TlsFilesReport* report = nullptr);

}  // namespace conveyor::proto

#endif  // CONVEYOR_PROTO_CREDENTIALS_H_
