// Process-wide logging setup on top of spdlog.
//
// Log with spdlog's source-location macros so every line carries file:line:
//   SPDLOG_INFO("worker {} registered", id);
// InitLogging() installs the pattern "2026-11-21T09:30:00.123456 INFO
// file.cc:42 message" on stderr. Call it once, early in main(), before other
// threads start; logging itself is thread-safe.
#ifndef CONVEYOR_COMMON_LOGGING_H_
#define CONVEYOR_COMMON_LOGGING_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace conveyor {

// The levels InitLogging accepts, for --log-level help texts.
inline constexpr absl::string_view kLogLevels =
    "trace, debug, info, warn, error, off";

// Sets the default logger to a colourless stderr sink with the Conveyor
// pattern and the given level. Returns InvalidArgument for an unknown level,
// naming the allowed ones.
absl::Status InitLogging(absl::string_view level);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_LOGGING_H_
