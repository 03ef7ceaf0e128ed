// `conveyorctl export CHECKPOINT_DIR [--step N] --output FILE.safetensors`:
// gathers one step of a pipelined job's checkpoint into a single safetensors
// file with the global (PyTorch) parameter names, loadable by the equivalent
// PyTorch module or as a job's model.init.from.
//
// At the end of a job each worker writes, for every stage s it holds,
// <dir>/step-<N>/stage-<s>.safetensors with the metadata
//   format: conveyor-stage-v1, job: <id>, stage: <s>, num_stages: <S>,
//   step: <N>
// Export takes step N (default: the highest step whose stage files
// 0..S-1 are all present and consistent; incomplete higher steps are
// skipped with a note), checks that every file agrees (format, job, step,
// num_stages, its own stage number) and that no tensor name appears twice,
// and writes the tensors, bytes unchanged, atomically to the output.
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
  // Why higher steps were passed over when choosing the latest one.
  std::vector<std::string> skipped;
};

// Writes step `step` (nullopt: the latest complete one) of the checkpoint in
// `dir` to `output`. Errors: NotFound for a missing directory or step;
// FailedPrecondition for an incomplete or inconsistent step (a missing stage
// file, metadata that disagrees, a duplicate tensor name, a file that is not
// valid safetensors), or when no step is complete; the errno-derived code
// when the output cannot be written.
absl::StatusOr<ExportResult> ExportCheckpoint(const std::string& dir,
                                              std::optional<int64_t> step,
                                              const std::string& output);

// InvalidArgument for a negative --step; otherwise ExportCheckpoint's errors.
absl::Status RunExportCommand(const ExportCommandOptions& options,
                              std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_EXPORT_COMMAND_H_
