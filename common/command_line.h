// The start of every Conveyor binary's main(): parse the flags with CLI11
// and set up logging, with the same exit codes everywhere (0 after --help or
// --version, 2 for invalid flags or an unknown log level).
// Thread-compatible: call once, from main, before starting threads.
#ifndef CONVEYOR_COMMON_COMMAND_LINE_H_
#define CONVEYOR_COMMON_COMMAND_LINE_H_

#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/string_view.h"

namespace conveyor {

inline constexpr int kExitUsage = 2;

// Parses argv into `app`, then initializes logging at `*log_level` (bound to
// the app's --log-level option, so read after parsing). Returns the exit
// code when main should return at once, nullopt to go on. `program` prefixes
// the log-level error.
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv,
                                    absl::string_view program,
                                    const std::string* log_level);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_COMMAND_LINE_H_
