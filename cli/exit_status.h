// How a command's absl::Status becomes conveyorctl's exit code and message:
// OK exits 0; InvalidArgument (bad flags, a bad job) exits 2; anything else
// exits 1, all after "conveyorctl: <message>" on stderr. A command that has
// already told the user what happened (watch printed "FAILED: reason"; run
// was interrupted) returns an AlreadyReported status: its own exit code and
// no second message.
// Thread-safe (pure functions).
#ifndef CONVEYOR_CLI_EXIT_STATUS_H_
#define CONVEYOR_CLI_EXIT_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace conveyor::cli {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// A failure with `code` and `message` for callers that inspect it, marked so
// that ExitCode() gives `exit_code` and ShouldPrint() false.
absl::Status AlreadyReported(absl::StatusCode code, absl::string_view message,
                             int exit_code);

int ExitCode(const absl::Status& status);
bool ShouldPrint(const absl::Status& status);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_EXIT_STATUS_H_
