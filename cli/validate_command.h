// `conveyorctl validate JOB.yaml [--set k.path=v ...]`: checks a job without
// a coordinator, with the same parser and planner the coordinator uses, and
// prints the plan (schedule, stages and their layers, parameters) and the
// number of workers the job needs. A bad job is InvalidArgument
// "file:line:col: ..." (exit 2). With `pipeline: {stages: auto}` it profiles
// the layers on this machine's CPU (the coordinator profiles on the job's
// first worker) and prints the chosen split: layers, predicted time and
// memory per stage, the predicted step and bubble, and the even split's
// predicted step for comparison. `-o json` prints the plan as one object
// instead (docs/cli-json.md): file, name, workers, num_stages,
// virtual_stages, schedule, devices_per_stage, batch_size, microbatches,
// steps, parameters, stages [{stage, rank, first_layer, num_layers,
// num_params}], and with stages: auto, auto_split {profiled_on,
// predicted_step_seconds, bubble_fraction, even_step_seconds (null when the
// even split does not fit)}.
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
  bool json = false;            // -o json: the plan as one JSON object
};

CLI::App* AddValidateCommand(CLI::App& app, ValidateCommandOptions& options);

// InvalidArgument for a bad job or override; the errno-derived code when the
// file cannot be read.
absl::Status RunValidateCommand(const ValidateCommandOptions& options,
                                std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_VALIDATE_COMMAND_H_
