// `conveyorctl export CHECKPOINT_DIR [--step N] --output FILE.safetensors`:
// gathers the parameters of one step of a pipelined job's checkpoint into a
// single safetensors file with the global (PyTorch) parameter names,
// loadable by the equivalent PyTorch module or as a job's model.init.from.
//
// Workers write <dir>/step-<N>/stage-<s>.safetensors for every stage, with
// the metadata
//   format: conveyor-stage-v1, job: <id>, stage: <s>, num_stages: <S>,
//   step: <N>
// and the coordinator commits the step by writing its manifest last
// (checkpoint/manifest.h). Export reads complete steps only: one
// whose manifest parses and whose files all have the recorded size and
// CRC-32C. Without --step it takes the newest such step (newer incomplete
// or corrupt steps are skipped with a note); --step N must name a complete
// step. It then checks that every file agrees with the manifest and the
// others (format, job, step, num_stages, its own stage number) and that no
// tensor name appears twice, and writes the parameters, bytes unchanged,
// atomically to the output. The optimizer state the stage files carry for
// resume ("optimizer/<slot>/<parameter>") is left out.
// Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_EXPORT_COMMAND_H_
#define CONVEYOR_CLI_EXPORT_COMMAND_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor::cli {

struct ExportCommandOptions {
  std::string checkpoint_dir;
  int64_t step = -1;  // -1: the latest complete step.
  std::string output;
};

CLI::App* AddExportCommand(CLI::App& app, ExportCommandOptions& options);

struct ExportResult {
  int64_t step = 0;
  int num_stages = 0;
  std::string job;
  int64_t num_tensors = 0;
  int64_t num_elements = 0;
  uint64_t bytes = 0;
  // Why newer steps were passed over when choosing the latest one.
  std::vector<std::string> skipped;
};

// Writes the parameters of step `step` (nullopt: the newest complete one)
// of the checkpoint in `dir` to `output`. Errors:
//   NotFound            a missing directory, no step-<N> directories, or no
//                       step `step`;
//   FailedPrecondition  `step` has no manifest (incomplete), no step is
//                       complete, or the stage files disagree (metadata
//                       against the manifest or each other, a duplicate
//                       tensor name, a file that is not valid safetensors);
//   DataLoss            `step`'s manifest is unreadable or a stage file is
//                       missing or differs from the manifest's size or
//                       CRC-32C;
//   the errno-derived code when a file cannot be read or the output cannot
//   be written.
absl::StatusOr<ExportResult> ExportCheckpoint(const std::string& dir,
                                              std::optional<int64_t> step,
                                              const std::string& output);

// InvalidArgument for a negative --step; otherwise ExportCheckpoint's errors.
absl::Status RunExportCommand(const ExportCommandOptions& options,
                              std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_EXPORT_COMMAND_H_
