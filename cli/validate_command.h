// `conveyorctl validate JOB.yaml [--set k.path=v ...]`: checks a job without
// a coordinator, with the same parser and planner the coordinator uses, and
// prints the plan (schedule, stages and their layers, parameters) and the
// number of workers the job needs. A bad job is InvalidArgument
// "file:line:col: ..." (exit 2).
// Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_VALIDATE_COMMAND_H_
#define CONVEYOR_CLI_VALIDATE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace conveyor::cli {

struct ValidateCommandOptions {
  std::string job_file;
  std::vector<std::string> overrides;
};

CLI::App* AddValidateCommand(CLI::App& app, ValidateCommandOptions& options);

// InvalidArgument for a bad job or override; the errno-derived code when the
// file cannot be read.
absl::Status RunValidateCommand(const ValidateCommandOptions& options,
                                std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_VALIDATE_COMMAND_H_
