// `conveyorctl schedule`: generate, validate, simulate and render a pipeline
// schedule. The options are registered on a CLI11 subcommand; running them is
// a separate function over a plain options struct, so it can be called
// without parsing. Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_SCHEDULE_COMMAND_H_
#define CONVEYOR_CLI_SCHEDULE_COMMAND_H_

#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace conveyor::cli {

struct ScheduleCommandOptions {
  std::string kind = "1f1b";
  int stages = 0;          // P, required unless `from` is set
  int microbatches = 0;    // M, required unless `from` is set
  int virtual_stages = 0;  // V; 0: the kind's (2 for zb-v, dualpipev; else 1)
  // "F,B" (full backward) or "F,BI,BW" (split backward). Empty: 1,2 for
  // schedules with a full backward, 1,1,1 for split ones (zb-*).
  // With `from`, an empty costs and latency, bandwidth and activation_bytes
  // take the file's "costs" (what --format json wrote), else their defaults.
  std::string costs;
  std::string latency;           // Empty: 0.
  std::string bandwidth;         // Bytes per time unit; empty or 0: free.
  std::string activation_bytes;  // Empty: 0.
  std::string format = "text";
  std::string output;  // Empty: standard output.
  // A schedule in the JSON shape of --format json (hand-written or edited)
  // to validate, simulate and render instead of generating one.
  std::string from;
};

// Adds the `schedule` subcommand to `app`, bound to `options`.
CLI::App* AddScheduleCommand(CLI::App& app, ScheduleCommandOptions& options);

// Runs the command, writing the rendering to `out` (or to options.output).
// InvalidArgument for bad options (the caller exits 2); other errors exit 1.
absl::Status RunScheduleCommand(const ScheduleCommandOptions& options,
                                std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_SCHEDULE_COMMAND_H_
