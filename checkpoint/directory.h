// The checkpoint directory as a whole: which steps it holds, the newest
// complete one, retention, a fresh start, and the check at submission that
// it can be written at all. A step is complete exactly when
// LoadCompleteCheckpoint (checkpoint/manifest.h) accepts it; everything here
// is built on that one rule.
//
// Thread-safety: pure functions over their arguments and the filesystem.
// Concurrent readers are safe; the coordinator is the only one that removes
// steps.
#ifndef CONVEYOR_CHECKPOINT_DIRECTORY_H_
#define CONVEYOR_CHECKPOINT_DIRECTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/manifest.h"

namespace conveyor::checkpoint {

// The N of every step-<N> directory in `checkpoint_dir`, ascending. Only
// canonical non-negative decimals count ("step-01", "step-x", "step-1.tmp"
// and files are ignored). Returns NotFound "no such checkpoint directory"
// if it does not exist, FailedPrecondition if it is not a directory, the
// errno-derived code if it cannot be listed.
absl::StatusOr<std::vector<int64_t>> ListCheckpointSteps(
    const std::string& checkpoint_dir);

struct LatestCheckpoint {
  CheckpointManifest manifest;
  // Why each newer (uncommitted) step was passed over, newest first.
  std::vector<std::string> skipped;
};

// The newest step that LoadCompleteCheckpoint accepts, passing over newer
// steps that were never committed (no manifest: a crash while saving).
// Returns ListCheckpointSteps' errors; DataLoss when the newest committed
// step fails its checks (a truncated or altered file, a damaged manifest),
// naming it and the newest intact step before it, since resuming from an
// older step must be the caller's choice; the error of a step whose state
// cannot be read (e.g. PermissionDenied); or FailedPrecondition "no
// complete checkpoint" with the reasons (the first few) when no step is
// committed.
absl::StatusOr<LatestCheckpoint> FindLatestCompleteCheckpoint(
    const std::string& checkpoint_dir, bool verify_checksums);

// Deletes old step directories and returns the steps removed, ascending.
// Keeps the newest `keep_latest` complete steps (complete: the manifest and
// file sizes check out; checksums are not read) and removes older complete
// ones and every incomplete step directory older than the newest complete
// step (leftovers of a crash). Never removes the newest complete step and
// never touches a step newer than it, which may be being written; so with no
// complete step, or keep_latest <= 0, it removes nothing. Returns
// ListCheckpointSteps' errors, the error of a step whose completeness cannot
// be decided (e.g. PermissionDenied), or the errno-derived code of a failed
// removal (steps removed before it stay removed).
absl::StatusOr<std::vector<int64_t>> PruneCheckpoints(
    const std::string& checkpoint_dir, int keep_latest);

// Creates `checkpoint_dir` if it is missing and writes, fsyncs and removes
// a probe file there, so that a job whose checkpoints cannot be written is
// refused when it is submitted rather than failing at its first checkpoint
// (a read-only directory once failed a job after 2 of 3 steps, losing
// them). FailedPrecondition naming the directory and the cause (read-only
// file system, permission, not a directory, full disk).
absl::Status CheckCheckpointDirWritable(const std::string& checkpoint_dir);

// Deletes every step-<N> directory in `checkpoint_dir`, complete or not,
// newest first (so a failure part way leaves only older steps), and returns
// the steps removed, ascending: a fresh start over an earlier run's
// checkpoints (`conveyorctl run --overwrite`). Nothing else in the directory
// is touched. A missing directory has nothing to remove. Returns
// ListCheckpointSteps' other errors, or the errno-derived code of a failed
// removal (steps removed before it stay removed).
absl::StatusOr<std::vector<int64_t>> RemoveAllCheckpoints(
    const std::string& checkpoint_dir);

}  // namespace conveyor::checkpoint

#endif  // CONVEYOR_CHECKPOINT_DIRECTORY_H_
