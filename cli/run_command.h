// `conveyorctl run JOB.yaml --in-process`: trains the whole job in this
// process with the reference trainer, printing a line per step, and writes
// the final parameters to checkpoint.dir. (The embedded local cluster, which
// runs the same job on daemons, arrives with the coordinator and workers.)
// Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_RUN_COMMAND_H_
#define CONVEYOR_CLI_RUN_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace conveyor::cli {

struct RunCommandOptions {
  std::string job_file;
  bool in_process = false;
  int64_t steps = 0;  // 0: the job's training.steps.
  int64_t log_every = 1;
};

CLI::App* AddRunCommand(CLI::App& app, RunCommandOptions& options);

// InvalidArgument for a bad job or flags (exit 2); other errors exit 1.
absl::Status RunRunCommand(const RunCommandOptions& options, std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_RUN_COMMAND_H_
