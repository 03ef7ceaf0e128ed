// JobSource: a job file as conveyorctl parses it locally and sends it to the
// coordinator: its text with any `--set` overrides applied, the name error
// positions refer to, and the directory relative paths resolve against.
// Thread-safe (pure functions, apart from reading the file).
#ifndef CONVEYOR_CLI_JOB_FILE_H_
#define CONVEYOR_CLI_JOB_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/job_spec.h"

namespace conveyor::cli {

struct JobSource {
  std::string yaml;       // The text to parse or send.
  std::string file_name;  // The path as given; "<path> (with --set)" when
                          // overridden, since positions then refer to the
                          // emitted text, not the file.
  std::string base_dir;   // Absolute directory of the file.
  // The file as read, when overrides changed it; empty otherwise.
  std::string original_yaml;
  std::string original_file_name;
};

// Reads `path` (at most engine::kMaxJobFileBytes) and applies `overrides`
// ("key.path=value", see cli/overrides.h). Returns the errno-derived code
// (NotFound, ...) when the file cannot be read, InvalidArgument for a file
// over the limit, bad override syntax, or YAML the overrides cannot walk.
absl::StatusOr<JobSource> ReadJobSource(
    const std::string& path, absl::Span<const std::string> overrides);

// engine::ParseJobSpec over the source: InvalidArgument "file:line:col: ..."
// for a bad job. When overrides were applied and the file itself has the
// same error, the error is reported at its place in the file, not in the
// emitted text.
absl::StatusOr<engine::JobSpec> ParseJobSource(const JobSource& source);

// The overrides for `--steps S` (run, submit): `training.steps=S`, and
// when the job's cosine schedule decays over training.steps but warms up
// for S steps or more (which would make the job invalid: a quick smoke test
// of a real job), its warmup scaled by S / training.steps (at most S - 1),
// with a line for `note` saying so. Just `training.steps=S` when the job
// without it does not parse (its own error is reported with it).
std::vector<std::string> StepsOverrides(const std::string& path,
                                        absl::Span<const std::string> overrides,
                                        int64_t steps, std::string* note);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_JOB_FILE_H_
