// How conveyorctl reaches the coordinator: the flags every command that
// talks to it takes (--coordinator, --timeout, --tls-*, --auth-token-file),
// and the client they make. One place, so `status` and `plot job-3` connect
// the same way.
#ifndef CONVEYOR_CLI_COORDINATOR_FLAGS_H_
#define CONVEYOR_CLI_COORDINATOR_FLAGS_H_

#include <memory>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "cli/coordinator_client.h"
#include "proto/credentials.h"

namespace conveyor::cli {

struct CoordinatorFlags {
  std::string coordinator;  // Empty: ResolveCoordinatorAddress's fallbacks.
  // Empty: $CONVEYOR_AUTH_TOKEN_FILE, else no token.
  std::string auth_token_file;
  proto::TlsFiles tls;  // --tls-ca, --tls-cert, --tls-key
  double timeout_seconds = 10;
};

// Adds the flags to `cmd`.
void AddCoordinatorFlags(CLI::App* cmd, CoordinatorFlags& flags);

// A client as the flags say. InvalidArgument for a timeout that is not
// positive; the token file's and TLS files' errors, naming the flag. A
// token file readable by others is warned about on `err`.
absl::StatusOr<std::unique_ptr<CoordinatorClient>> ConnectToCoordinator(
    const CoordinatorFlags& flags, std::ostream& err);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_COORDINATOR_FLAGS_H_
