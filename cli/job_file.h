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
#include "cli/overrides.h"
#include "job/job_spec.h"
#include "job/parsed_job.h"
#include "yaml-cpp/yaml.h"

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

// Reads `path` (at most job::kMaxJobFileBytes) and applies `overrides`
// ("key.path=value", see cli/overrides.h), then, with `steps` > 0, those of
// `--steps` (StepsOverrides), noting on `note` what they change. The file
// is loaded once for all of them. Returns the errno-derived code (NotFound,
// ...) when the file cannot be read, InvalidArgument for a file over the
// limit, bad override syntax, or YAML the overrides cannot walk.
absl::StatusOr<JobSource> ReadJobSource(const std::string& path,
                                        absl::Span<const std::string> overrides,
                                        int64_t steps = 0,
                                        std::string* note = nullptr);

// A job given as text rather than a file (the job a checkpoint's manifest
// records), as ReadJobSource makes one of a file: `name` stands for the file
// in errors, `base_dir` is what its relative paths resolve against (empty:
// they stay relative), and `overrides` and `derive` apply as in
// ApplyOverrides (cli/overrides.h). InvalidArgument for text over
// job::kMaxJobFileBytes or not UTF-8, bad override syntax, or YAML the
// overrides cannot walk.
absl::StatusOr<JobSource> JobSourceFromText(
    std::string text, const std::string& name, const std::string& base_dir,
    absl::Span<const std::string> overrides,
    const DeriveOverrides& derive = {});

// job::ParseJob over the source: the one parse of the job in this process.
// InvalidArgument "file:line:col: ..." for a bad job. When overrides were
// applied and the file itself has the same error, the error is reported at
// its place in the file, not in the emitted text.
absl::StatusOr<job::ParsedJob> ParseJobSource(const JobSource& source);

// The overrides for `--steps S` (run, submit) of the job document `doc`:
// `training.steps=S`, and when the job's cosine schedule decays over
// training.steps but warms up for S steps or more (which would make the job
// invalid: a quick smoke test of a real job), its warmup scaled by S /
// training.steps (at most S - 1), with a line for `note` saying so. Just
// `training.steps=S` when those values are not integers (the job's own
// error is reported when it is parsed).
std::vector<std::string> StepsOverrides(const YAML::Node& doc, int64_t steps,
                                        std::string* note);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_JOB_FILE_H_
