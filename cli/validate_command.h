// `conveyorctl validate JOB.yaml [--set k.path=v ...]`: checks a job without
// a coordinator, with the same parser and planner the coordinator uses, and
// prints the plan (schedule, stages and their layers, parameters) and the
// number of workers the job needs. A bad job is InvalidArgument
// "file:line:col: ..." (exit 2). With `pipeline: {stages: auto}` it profiles
// the layers on this machine's CPU (the coordinator profiles on the job's
// first worker) and prints the chosen split: layers, predicted time and
// memory per stage, the predicted step and bubble, and the even split's
// predicted step for comparison.
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
  int profile_repetitions = 3;  // stages: auto
};

CLI::App* AddValidateCommand(CLI::App& app, ValidateCommandOptions& options);

// InvalidArgument for a bad job or override; the errno-derived code when the
// file cannot be read.
absl::Status RunValidateCommand(const ValidateCommandOptions& options,
                                std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_VALIDATE_COMMAND_H_
