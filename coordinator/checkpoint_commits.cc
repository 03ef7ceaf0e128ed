#include "coordinator/checkpoint_commits.h"

#include <thread>
#include <utility>

#include "absl/strings/str_join.h"
#include "checkpoint/directory.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

void CheckpointCommits::Enqueue(Commit commit) {
  MutexLock lock(mu_);
  queued_.push_back(std::move(commit));
}

void CheckpointCommits::WriteQueued(absl::FunctionRef<void()> after_each) {
  while (true) {
    Commit commit;
    {
      MutexLock lock(mu_);
      if (writing_ || queued_.empty()) return;
      writing_ = true;
      commit = std::move(queued_.front());
      queued_.pop_front();
    }
    Written written = Write(commit);
    {
      MutexLock lock(mu_);
      written_.push_back(std::move(written));
      writing_ = false;
    }
    write_ended_.NotifyAll();
    after_each();
  }
}

void CheckpointCommits::Flush() {
  MutexLock lock(mu_);
  write_ended_.Wait(
      mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; });
  // Written here, under this lock: a WriteQueued meanwhile finds nothing
  // queued, or sees writing_ and leaves the rest to this loop.
  while (!queued_.empty()) {
    Commit commit = std::move(queued_.front());
    queued_.pop_front();
    written_.push_back(Write(commit));
  }
}

std::vector<CheckpointCommits::Written> CheckpointCommits::TakeWritten() {
  MutexLock lock(mu_);
  return std::exchange(written_, {});
}

CheckpointCommits::Written CheckpointCommits::Write(const Commit& commit) {
  const int64_t step = commit.manifest.step;
  if (commit.before_write) commit.before_write(step);
  if (commit.pause.count() > 0) {
    SPDLOG_WARN(
        "{}: fault injection: every file of step {} is in; pausing {} ms "
        "before its manifest",
        commit.job_id, step, commit.pause.count());
    std::this_thread::sleep_for(commit.pause);
  }
  Written out{.step = step};
  out.status = checkpoint::WriteManifest(commit.dir, commit.manifest);
  if (!out.status.ok()) return out;
  out.point = checkpoint::ResumePointOf(commit.manifest, commit.dir);
  if (commit.keep_latest > 0) {
    absl::StatusOr<std::vector<int64_t>> removed =
        checkpoint::PruneCheckpoints(commit.dir, commit.keep_latest);
    if (!removed.ok()) {
      // The new step is committed; an old one left behind costs only disk.
      SPDLOG_WARN("{}: pruning old checkpoints in {}: {}", commit.job_id,
                  commit.dir, std::string(removed.status().message()));
    } else if (!removed->empty()) {
      SPDLOG_INFO("{}: removed checkpoint steps {} (keep_latest {})",
                  commit.job_id, absl::StrJoin(*removed, ", "),
                  commit.keep_latest);
    }
  }
  return out;
}

}  // namespace conveyor::coordinator
