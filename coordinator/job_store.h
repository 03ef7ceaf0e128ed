// JobStore: the job records on disk (--state-file, coordinator/state_file.h).
// It turns the records into a v1::CoordinatorState (Snapshot: every record;
// Changes: only those that changed) and back (Restore), writes them when
// they changed (Persist: the changed records appended to the state file's
// journal, so that a write costs the same with 16 jobs or 512), and keeps
// the health of the file: why the last write failed, until one succeeds
// (StateFileError). What a restored job does next (restart, fail, queue
// again) is the JobManager's decision (JobManager::Restore).
//
// Thread-safe: Persist, Save, SaveAhead, PersistedThrough and
// StateFileError may be called from any thread; one write at a time
// (persist_mu_), each of changes at least as new as the last, and
// StateFileError never waits behind a slow write (health_mu_). They must be
// called without the manager's lock: Persist takes it itself, through its
// `take` callback, after persist_mu_ (the order is persist_mu_, then the
// manager's lock). Snapshot, Changes and Restore are static and read or fill
// records the caller holds under the manager's lock.
#ifndef CONVEYOR_COORDINATOR_JOB_STORE_H_
#define CONVEYOR_COORDINATOR_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/job_queue.h"
#include "coordinator/job_run.h"
#include "coordinator/state_file.h"

namespace conveyor::coordinator {

class JobStore {
 public:
  // The records as they were at change number `change`: every record
  // (`full`, replacing what the file holds), or only those that changed
  // since the last Persist took them, with the jobs forgotten since in
  // `removed` (JobStore::Changes).
  struct Snapshotted {
    uint64_t change = 0;
    v1::CoordinatorState state{};
    bool full = true;
    std::vector<uint64_t> removed{};
  };

  // What Restore read, for the manager to act on.
  struct Restored {
    // At least the saved next_job and one past the highest job number.
    uint64_t next_job = 1;
    // Ended jobs, in the order they ended (their yaml already dropped).
    std::vector<uint64_t> ended;
    // Jobs that were placed (PLANNING, RUNNING) when the coordinator
    // stopped, by number.
    std::vector<uint64_t> interrupted;
    // Queued jobs, in their queue order.
    std::vector<uint64_t> queued;
    // Why a job's saved file no longer parses, by job number (jobs not yet
    // ended only).
    std::map<uint64_t, absl::Status> unparsed;
  };

  // `file`: where the records go; optional (nothing is written without
  // one), and it outlives the store.
  explicit JobStore(StateFile* file) : file_(file) {}

  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // The records of `jobs` and the order of `queue`, as a state file holds
  // them, stamped with the coordinator's `version` and `next_job`.
  static v1::CoordinatorState Snapshot(const std::string& version,
                                       uint64_t next_job,
                                       const std::map<uint64_t, JobRun>& jobs,
                                       const JobQueue& queue);

  // The records of the jobs numbered in `changed` that `jobs` holds, the
  // order of `queue` (all of it), `version` and `next_job`: what changed, as
  // StateFile::Append takes it. The numbers in `changed` that `jobs` no
  // longer holds (forgotten jobs) go to `removed`. Costs the changed
  // records and the queue's length, not the number of jobs.
  static v1::CoordinatorState Changes(const std::string& version,
                                      uint64_t next_job,
                                      const std::map<uint64_t, JobRun>& jobs,
                                      const JobQueue& queue,
                                      const std::set<uint64_t>& changed,
                                      std::vector<uint64_t>* removed);

  // Reads the records of `state` into `jobs` (empty before), each made
  // with `context`: as saved, not yet placed (a new secret; no worker of
  // this coordinator has heard of them), jobs not yet ended parsed again
  // (a failure to parse is in Restored::unparsed). DataLoss for records
  // that contradict each other (a job id twice, or not "job-<n>"), and
  // then `jobs` is left empty.
  static absl::StatusOr<Restored> Restore(const v1::CoordinatorState& state,
                                          JobRunContext& context,
                                          std::map<uint64_t, JobRun>& jobs);

  // Writes the records `take` returns (a full snapshot, or only the
  // changed ones), unless it returns nullopt (the records are as they were
  // at change number `persisted`, the newest one written). `full` asks for
  // every record: the last write failed, and the changes it was given may
  // not be in the file. OK without a state file (then `take` is not
  // called); otherwise the write's error, logged once per outage and
  // reported by StateFileError until a write succeeds.
  absl::Status Persist(absl::FunctionRef<std::optional<Snapshotted>(
                           uint64_t persisted, bool full)>
                           take) ABSL_LOCKS_EXCLUDED(persist_mu_);

  // Replaces every record with `state` and keeps StateFileError current.
  // OK without a state file.
  absl::Status Save(const v1::CoordinatorState& state)
      ABSL_LOCKS_EXCLUDED(persist_mu_);
  // Writes the records in `changed` (JobStore::Changes) ahead of the
  // manager's own change, such as CancelJob's, and keeps StateFileError
  // current. OK without a state file. After a failure the next Persist
  // asks for every record, so that the file holds the jobs as they really
  // are rather than as `changed` would have them.
  absl::Status SaveAhead(const v1::CoordinatorState& changed)
      ABSL_LOCKS_EXCLUDED(persist_mu_);

  // Whether a write has held the records as they were at change number
  // `change` (always, without a state file).
  bool PersistedThrough(uint64_t change) ABSL_LOCKS_EXCLUDED(persist_mu_);

  // Empty while the state file is written (or there is none); otherwise
  // why the last write failed, naming the file.
  std::string StateFileError() const ABSL_LOCKS_EXCLUDED(health_mu_);

 private:
  // Keeps StateFileError and want_full_ current with the result of a
  // write (`full`: of every record).
  absl::Status Written(absl::Status saved, bool full)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_);

  StateFile* const file_;
  // One writer of the state file at a time, each writing a snapshot at
  // least as new as the last one.
  Mutex persist_mu_;
  uint64_t persisted_changes_ ABSL_GUARDED_BY(persist_mu_) = 0;
  // A write failed: the next Persist asks for every record.
  bool want_full_ ABSL_GUARDED_BY(persist_mu_) = false;
  // Its own mutex, so that reading it never waits behind a slow write.
  mutable Mutex health_mu_;
  std::string state_file_error_ ABSL_GUARDED_BY(health_mu_);
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_JOB_STORE_H_
