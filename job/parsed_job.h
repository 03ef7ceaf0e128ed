// ParsedJob: a job file parsed once: its spec, the two configuration hashes
// every checkpoint manifest records (job/config_hash.h), and the text and
// names they came from. A process loads a job's YAML once (ParseJob) and
// keeps this: the coordinator for every plan, restart, relayout and restore
// of the job, a worker from profiling to preparation, the CLI for its
// checks and what it submits. The spec is the file's: plans start from a
// copy (the planner, a checkpoint's cut and an elastic relayout change their
// copy, never this).
//
// Thread-safe (pure functions).
#ifndef CONVEYOR_JOB_PARSED_JOB_H_
#define CONVEYOR_JOB_PARSED_JOB_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "job/job_spec.h"

namespace conveyor::job {

struct ParsedJob {
  JobSpec spec;
  std::string config_hash;    // JobConfigHash(yaml)
  std::string training_hash;  // JobTrainingHash(yaml)
  std::string yaml;           // The text parsed.
  std::string file_name;      // What error positions name.
  std::string base_dir;       // What relative paths resolved against.
};

// Parses a job document (as ParseJobSpec, job/job_spec.h) and hashes it,
// from one YAML load. Relative paths resolve against `base_dir` when it is
// non-empty. InvalidArgument "file:line:col: path: message".
absl::StatusOr<ParsedJob> ParseJob(absl::string_view yaml_text,
                                   absl::string_view file_name,
                                   absl::string_view base_dir = "");

// Reads (at most kMaxJobFileBytes) and parses a job file, resolving
// relative paths against its directory.
absl::StatusOr<ParsedJob> LoadJob(const std::string& path);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_PARSED_JOB_H_
