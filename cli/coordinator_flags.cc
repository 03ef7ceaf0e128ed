#include "cli/coordinator_flags.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/auth_token.h"
#include "common/status_macros.h"

namespace conveyor::cli {

void AddCoordinatorFlags(CLI::App* cmd, CoordinatorFlags& flags) {
  cmd->add_option(
      "--coordinator", flags.coordinator,
      absl::StrCat("Coordinator address host:port (default: $", kCoordinatorEnv,
                   ", else ", kDefaultCoordinatorAddress, ")"));
  cmd->add_option("--timeout", flags.timeout_seconds,
                  "Seconds to wait for each request's answer")
      ->capture_default_str();
  cmd->add_option("--tls-ca", flags.tls.ca,
                  "PEM CA that signed the coordinator's certificate: "
                  "connect with TLS");
  cmd->add_option("--tls-cert", flags.tls.cert,
                  "PEM client certificate, for a coordinator that requires "
                  "one (with --tls-key)");
  cmd->add_option("--tls-key", flags.tls.key, "PEM private key of --tls-cert");
  cmd->add_option("--auth-token-file", flags.auth_token_file,
                  absl::StrCat("File holding the cluster's shared token "
                               "(default: $",
                               kAuthTokenFileEnv, ", else none)"));
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> ConnectToCoordinator(
    const CoordinatorFlags& flags, std::ostream& err) {
  if (!(flags.timeout_seconds > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout must be positive; got ", flags.timeout_seconds));
  }
  std::string token_file = flags.auth_token_file;
  if (const char* env = std::getenv(kAuthTokenFileEnv);
      token_file.empty() && env != nullptr) {
    token_file = env;
  }
  std::string token;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> read = ReadAuthTokenFile(token_file);
    if (!read.ok()) {
      return absl::Status(
          read.status().code(),
          absl::StrCat("--auth-token-file: ", read.status().message()));
    }
    token = *std::move(read);
    if (const std::string warning = AuthTokenFileWarning(token_file);
        !warning.empty()) {
      err << "conveyorctl: warning: " << warning << "\n";
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   proto::MakeChannelCredentials(flags.tls));
  return CoordinatorClient::Create(
      ResolveCoordinatorAddress(flags.coordinator),
      absl::Seconds(flags.timeout_seconds), std::move(token),
      std::move(credentials),
      {.tls = !flags.tls.ca.empty(), .client_cert = !flags.tls.cert.empty()});
}

}  // namespace conveyor::cli
