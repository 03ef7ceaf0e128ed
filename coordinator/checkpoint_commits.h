// CheckpointCommits: one job's checkpoint manifests on their way to disk.
//
// A commit writes the step's manifest durably (temporary file, fsync,
// rename, fsync of the directory) and prunes older steps: milliseconds of
// I/O, where handling a step report takes microseconds. Done under the
// JobManager's lock, every heartbeat of a fleet waited behind every commit
// (4,096 workers, 512 jobs checkpointing every 10 steps: 51 commits a
// second, heartbeat p99 20 ms). So a commit is queued under the lock
// (Enqueue), written without it by the thread that queued it (WriteQueued),
// and its outcome applied under the lock again (TakeWritten).
//
// The decisions that must see every commit a job's ranks completed (the
// job's end, a drain, a restart) Flush under the manager's lock: it waits
// for the write in progress, which needs no lock of the manager's to end,
// and writes the rest itself. Those come once per attempt, not per step.
//
// One write at a time per job, in the order queued, each with its pruning:
// a step's manifest is never written after a newer step's pruning ran, and
// once Flush returns the job's directory is as the newest commit left it.
//
// Thread-safe. Shared (std::shared_ptr) between the job's record and the
// threads writing it, which may outlive the record.
#ifndef CONVEYOR_COORDINATOR_CHECKPOINT_COMMITS_H_
#define CONVEYOR_COORDINATOR_CHECKPOINT_COMMITS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "checkpoint/manifest.h"
#include "checkpoint/resume.h"
#include "common/mutex.h"

namespace conveyor::coordinator {

class CheckpointCommits {
 public:
  struct Commit {
    std::string job_id{};  // For the log.
    std::string dir{};     // checkpoint.dir
    checkpoint::CheckpointManifest manifest{};
    int keep_latest = 0;  // checkpoint.keep_latest; 0 keeps every step.
    // Test hooks (JobManagerOptions): called, then slept, before the
    // manifest is written.
    std::function<void(int64_t step)> before_write{};
    std::chrono::milliseconds pause{0};
  };
  struct Written {
    int64_t step = 0;
    // OK, or why the manifest could not be written (the step is not
    // committed). A failed pruning is only logged: an old step left
    // behind costs only disk.
    absl::Status status{};
    // The committed step, when `status` is OK.
    std::optional<checkpoint::ResumePoint> point{};
  };

  void Enqueue(Commit commit) ABSL_LOCKS_EXCLUDED(mu_);

  // Writes queued commits one after another until none is left or another
  // thread is writing this job's (which then writes the rest), calling
  // `after_each` after each, with no lock held: the manager applies the
  // outcome there (TakeWritten under its lock).
  void WriteQueued(absl::FunctionRef<void()> after_each)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Waits for a write in progress and writes every commit still queued.
  // May be called under the manager's lock.
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);

  // The outcomes written and not yet taken, oldest first.
  std::vector<Written> TakeWritten() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Writes `commit` (no lock held).
  static Written Write(const Commit& commit);

  Mutex mu_;
  CondVar write_ended_;
  std::deque<Commit> queued_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Written> written_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_CHECKPOINT_COMMITS_H_
