// JobManager: the coordinator's state and every decision it makes: the
// worker registry (registration with version checks, heartbeats, loss), the
// job queue (by priority with aging, then first come, first served; owner
// quotas and preemption by drain: coordinator/job_queue.h, placer.h), the
// job state machine
//
//   QUEUED -> PLANNING -> RUNNING -> SUCCEEDED | FAILED (reason) | CANCELLED
//
// placement (stage s on the job's rank s mod P, ranks on the first P idle
// workers), and the aggregation of per-rank step reports into one event per
// step. It knows nothing of gRPC: workers are reached through
// WorkerConnection (a real stream in service.cc, a fake in tests), and time
// comes from an injectable clock, so tests drive every transition
// deterministically.
//
// Jobs with `pipeline: {stages: auto}` are placed first and then cut: the
// first worker profiles the layers (ProfileModel, answered by ModelProfile;
// skipped when a profile of the same model, microbatch size and device is
// cached), the planner chooses the split, and only then do the programs go
// out. The job stays PLANNING throughout, under the same prepare_timeout.
//
// Checkpoints. Each worker reports the files it wrote for a step
// (CheckpointSaved); once every stage's are in, the manager writes the step's
// manifest (checkpoint/resume.h) and only then counts the step as the
// job's last_checkpoint_step, pruning older steps to checkpoint.keep_latest.
// A job with `resume:` is checked against its checkpoint at submission (the
// same configuration, stages and cut) and refused rather than started from
// scratch when there is none.
//
// Failure semantics. A worker is lost when its connection closes or it sends
// nothing for heartbeat_timeout; its job fails at once with a reason naming
// the worker, its rank and stages and what was observed, and the job's other
// workers are told to cancel. With `restart: {max_restarts: N}` the job is
// instead queued again (at the head of the queue) to resume from the newest
// step it committed, on whichever workers are idle, at most N times; a
// worker that deregisters (SIGTERM) counts as lost. When a worker reports a
// failure instead, the job waits a short grace period before failing, because a
// peer's death is usually seen first by its neighbours' data plane: if the dead
// worker's loss is observed within the grace, the job's reason names it rather
// than the neighbour's symptom.
//
// Durability. With a StateFile (--state-file) the job records (each job's
// Job, its submission, checkpoint and restart state, and the queue) are
// written to disk whenever a job changes state or commits a checkpoint (only
// the records of the jobs that changed since the last write, and of those
// that stepped, MarkJobChanged and NoteProgress; appended to the state
// file's journal, so that a write costs the same with 16 jobs or 512):
// synchronously before SubmitJob, CancelJob and HandleWorkerMessage return
// (so an acknowledged submission or cancellation survives a crash: one that
// cannot be written is refused, UNAVAILABLE; and a commit is recorded
// before the worker's next message is read), and
// otherwise from Tick (within ~100 ms). Restore also takes a job's newest
// complete step from its checkpoint directory, which may be newer than the
// record if the coordinator died between the manifest and the record. Restore
// reads them back at start: ended jobs are listed as they were, queued jobs
// queue again in their order, and jobs that were placed when the coordinator
// went down (their workers stopped them when the session broke) restart from
// their newest committed step when their restart policy allows, and are FAILED
// saying so otherwise. Step counts and events between two writes are not kept.
//
// Its parts: the JobManager keeps the lock, the workers, the queue and the
// job records, and dispatches the workers' messages; each job's record and
// the handling of its attempts is a JobRun (coordinator/job_run.h), the
// queue's placement and the cutting of jobs a Placer (coordinator/placer.h),
// and the state file a JobStore (coordinator/job_store.h). Its options are
// in coordinator/job_manager_options.h.
//
// Thread-safe: every method may be called from any thread (one mutex, mu_,
// held by every call into a JobRun or the Placer).
// WorkerConnection::Send must not block (it queues).
#ifndef CONVEYOR_COORDINATOR_JOB_MANAGER_H_
#define CONVEYOR_COORDINATOR_JOB_MANAGER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/job_manager_options.h"
#include "coordinator/job_queue.h"
#include "coordinator/job_run.h"
#include "coordinator/job_store.h"
#include "coordinator/placer.h"
#include "coordinator/worker_registry.h"

namespace conveyor::coordinator {

class JobManager {
 public:
  explicit JobManager(JobManagerOptions options);
  ~JobManager();

  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // ---- Workers (the WorkerSession service) ----

  // Registers a worker reached through `connection`: sends it the
  // Registered reply (its id and the heartbeat interval), which is also
  // returned, before any program. FailedPrecondition naming both versions when
  // the worker's protocol or release version differs from the coordinator's;
  // InvalidArgument for a registration without a name or devices.
  absl::StatusOr<v1::Registered> RegisterWorker(
      const v1::RegisterRequest& request,
      std::shared_ptr<WorkerConnection> connection);

  // A message from a registered worker after its registration.
  // FailedPrecondition for one that makes no sense (a report for a job the
  // worker does not run is ignored, not an error: it may be a late report of
  // a job that already ended).
  absl::Status HandleWorkerMessage(const std::string& worker_id,
                                   const v1::WorkerMessage& message);

  // The worker's session ended (`reason`: what was observed).
  void WorkerDisconnected(const std::string& worker_id,
                          const std::string& reason);

  // ---- Jobs (the Coordinator service) ----

  // Parses and plans the job, then queues it. InvalidArgument with
  // file:line:col for a bad job; ResourceExhausted when the cluster has
  // fewer live workers than the job needs, or the queue is full;
  // Unavailable when the state file cannot be written (the job is
  // withdrawn, and its id is never given to another).
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& request);
  // NotFound for an unknown id.
  absl::StatusOr<v1::Job> GetJob(const std::string& id) const;
  std::vector<v1::Job> ListJobs() const;
  // Cancels a queued or running job (idempotent on a finished one).
  // NotFound for an unknown id; Unavailable when the state file cannot be
  // written (the job is cancelled, but a restart would not know it: retry).
  absl::StatusOr<v1::Job> CancelJob(const std::string& id,
                                    const std::string& reason);
  std::vector<v1::Worker> ListWorkers() const;

  // Drains a worker (by id or name): it is given no more jobs; its running
  // job checkpoints at a step every rank agrees on (the two-step DrainJob
  // exchange, worker/drain_gate.h), ends there and is queued again at the
  // head to resume from that step on the other workers: laid out anew on
  // the live ones when elastic and no spare is idle, and otherwise waiting
  // for enough workers. A drain is not a restart (max_restarts is not
  // spent). A job without a checkpoint directory has nothing to move with:
  // it runs to its end here first. Once the worker holds no job it is told
  // to Leave. Idempotent. NotFound for an unknown or lost worker.
  absl::StatusOr<v1::Worker> DrainWorker(const std::string& worker,
                                         const std::string& reason);

  // The timelines every rank reported for step `step` of job `id` (0: the
  // newest complete step). NotFound for an unknown id, or for a step whose
  // timelines are not (or no longer) kept; the message lists those kept.
  absl::StatusOr<v1::Trace> GetTrace(const std::string& id, int64_t step) const;

  // Events of job `id` from sequence number `*cursor` on, waiting until
  // `deadline` for at least one; advances `*cursor`. A negative cursor
  // starts at the latest event (the job as it is now); one below the oldest
  // kept event starts at the oldest. `*done` is set once the job is
  // finished and every event has been returned. NotFound for an unknown id;
  // Cancelled after Shutdown.
  absl::StatusOr<std::vector<v1::JobEvent>> WaitEvents(
      const std::string& id, int64_t* cursor,
      std::chrono::steady_clock::time_point deadline, bool* done);

  // The number of events added to any job so far (and one more for
  // Shutdown), once it differs from `seen` or at `deadline`: how one thread
  // serving many watchers (coordinator/watch_hub.h) learns that some job
  // has news, without a thread blocked per watcher.
  uint64_t WaitForAnyEvent(uint64_t seen,
                           std::chrono::steady_clock::time_point deadline);
  // The jobs that had events since count `seen` (from WaitForAnyEvent or
  // here), by id, and the count now in `*now`; nullopt when that is no
  // longer known (more events since than are remembered, or Shutdown):
  // then any job may have news. So a hub of 1,024 watchers looks only at
  // the watches of the few jobs that stepped, not at every watch per pass.
  std::optional<std::vector<std::string>> JobsWithEventsSince(uint64_t seen,
                                                              uint64_t* now);

  // ---- Time and lifecycle ----

  // Takes over the job records a previous coordinator saved (see the header
  // comment). Only before the first worker registers or job is submitted:
  // FailedPrecondition after. DataLoss for records that contradict each other
  // (a job id twice, or not "job-<n>"); a job that cannot be planned again is
  // FAILED with the reason instead.
  absl::Status Restore(const v1::CoordinatorState& state);

  // Writes the state file when job records changed since the last write.
  // OK when there is nothing to write or no state file; otherwise the
  // write's error, which is logged once, retried at the next call, and
  // reported by StateFileError until a write succeeds. Tick, SubmitJob,
  // CancelJob and Shutdown call it; SubmitJob and CancelJob answer
  // UNAVAILABLE when it fails, so nothing is acknowledged that a restart
  // would forget.
  absl::Status Persist();

  // Empty while the state file is written (or there is none); otherwise
  // why the last write failed, naming the file: the coordinator is
  // unhealthy (submissions and cancels are refused) until a write succeeds.
  std::string StateFileError() const;

  // Checks heartbeats and timeouts and starts queued jobs; the daemon calls
  // it every ~100 ms.
  void Tick();

  // Writes the state file, then wakes every waiter; later WaitEvents return
  // Cancelled.
  void Shutdown();

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  // The manager as its JobRuns and its Placer see it (job_manager.cc).
  class RunContext;

  // A job's checkpoint commits to write once mu_ is released.
  using CommitsToWrite =
      std::pair<uint64_t, std::shared_ptr<CheckpointCommits>>;
  // HandleWorkerMessage's work, under mu_ (taken here); `*changed` says
  // whether a record changed (a write is due), `*commits` which jobs
  // queued manifests to write.
  absl::Status Dispatch(const std::string& worker_id,
                        const v1::WorkerMessage& message, bool* changed,
                        std::vector<CommitsToWrite>* commits)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DispatchLocked(const std::string& worker_id,
                              const v1::WorkerMessage& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker's JobEnded: frees it, and tells its job.
  void OnEnded(WorkerRecord& w, const v1::JobEnded& ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobRun* FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new record for job `number`, which must not have one.
  JobRun& AddJobRecord(uint64_t number) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The state file's view of the records (JobStore::Snapshot).
  v1::CoordinatorState Snapshot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restore's work once JobStore::Restore has read the records: ended jobs
  // listed, interrupted ones restarted or failed, queued ones queued.
  void RestartRestored(const JobStore::Restored& restored)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A restored job's priority and owner, from its parsed file.
  static void TakePolicy(JobRun::JobRecord& job);

  void TickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Discounts a stall of the coordinator since the last Tick from every
  // worker's silence (JobManagerOptions::stall_threshold).
  void DiscountStall(TimePoint now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkLost(WorkerRecord& w, const std::string& observed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `w` draining and moves its job (JobRun::DrainJob, or a requeue
  // of a job still planning), or tells it to leave when it holds none.
  void StartDrain(WorkerRecord& w, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A draining worker that holds no job leaves (once).
  void LeaveIfDrained(WorkerRecord& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWorker(WorkerRecord& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "worker-2 (local-1, rank 1, stages 1,3)".
  std::string DescribeWorker(const WorkerRecord& w) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `ended` has just ended: only the newest max_finished_jobs ended jobs
  // are kept, and only the newest trace_finished_jobs keep timelines.
  void ForgetOldJobs(JobRun& ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job records changed: the state file is due for a write of every record
  // (a new snapshot, as after Restore).
  void MarkChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++changes_;
    all_changed_ = true;
  }
  // Job `number`'s record changed (or it was forgotten): the state file is
  // due for a write of that record alone.
  void MarkJobChanged(uint64_t number) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++changes_;
    changed_jobs_.insert(number);
  }
  // Job `number`'s step count moved: its record goes with the next write
  // (as a full snapshot once carried every job's), which this does not
  // force: a step alone is not worth a write.
  void NoteProgress(uint64_t number) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    changed_jobs_.insert(number);
  }

  const JobManagerOptions options_;
  // The state file's writer, with its own mutexes (taken before mu_, never
  // while holding it).
  JobStore store_;
  mutable Mutex mu_;
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  // What changed since Persist last took the changes: every record, or the
  // jobs numbered here (so that a write costs only those).
  bool all_changed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<uint64_t> changed_jobs_ ABSL_GUARDED_BY(mu_);
  CondVar events_cv_;
  uint64_t event_count_ ABSL_GUARDED_BY(mu_) = 0;  // See WaitForAnyEvent.
  // The newest events' counts and jobs (JobsWithEventsSince); kEveryJob
  // stands for all (Shutdown).
  static constexpr uint64_t kEveryJob = 0;
  static constexpr size_t kRecentEvents = 4096;
  std::deque<std::pair<uint64_t, uint64_t>> recent_events_ ABSL_GUARDED_BY(mu_);
  // Counts an event of job `job` (kEveryJob: of all) and wakes
  // WaitForAnyEvent.
  void CountEvent(uint64_t job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // While Dispatch runs: commits queued meanwhile are written after it
  // releases mu_ (RunContext::WriteCommitsOutsideLock).
  bool dispatching_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<CommitsToWrite> commits_to_write_ ABSL_GUARDED_BY(mu_);
  // When Tick last ran; nullopt before the first.
  std::optional<TimePoint> last_tick_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  // Keyed by the number in "worker-<n>" and "job-<n>": registration and
  // submission order.
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  // A RunContext: what the JobRuns and the Placer reach the manager by.
  const std::unique_ptr<JobRunContext> context_;
  std::map<uint64_t, JobRun> jobs_ ABSL_GUARDED_BY(mu_);
  JobQueue queue_ ABSL_GUARDED_BY(mu_);
  // Holds references to *context_ and jobs_ (declared before it).
  Placer placer_ ABSL_GUARDED_BY(mu_);
  // Ended jobs, oldest first (max_finished_jobs).
  std::deque<uint64_t> finished_jobs_ ABSL_GUARDED_BY(mu_);
  // Ended jobs that still hold timelines, oldest first.
  std::deque<uint64_t> finished_traces_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_JOB_MANAGER_H_
