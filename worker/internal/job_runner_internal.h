// Helpers JobRunner's source files share (worker/job_runner.h); nothing
// outside JobRunner includes this.
#ifndef CONVEYOR_WORKER_INTERNAL_JOB_RUNNER_INTERNAL_H_
#define CONVEYOR_WORKER_INTERNAL_JOB_RUNNER_INTERNAL_H_

#include <filesystem>

#include "absl/status/status.h"

namespace conveyor::worker::job_runner_internal {

// Creates `dir` and its parents, if missing (a checkpoint directory, a
// step's directory in it); the error names the directory.
absl::Status CreateDirectories(const std::filesystem::path& dir);

}  // namespace conveyor::worker::job_runner_internal

#endif  // CONVEYOR_WORKER_INTERNAL_JOB_RUNNER_INTERNAL_H_
