// JobManager: the coordinator's state and every decision it makes: the
// worker registry (registration with version checks, heartbeats, loss), the
// FIFO job queue, the job state machine
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
// written to disk whenever a job changes state or commits a checkpoint:
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
// Thread-safe: every method may be called from any thread (one mutex).
// WorkerConnection::Send must not block (it queues).
#ifndef CONVEYOR_COORDINATOR_JOB_MANAGER_H_
#define CONVEYOR_COORDINATOR_JOB_MANAGER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/resume.h"
#include "common/mutex.h"
#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/attempt_ranks.h"
#include "coordinator/checkpoint_collector.h"
#include "coordinator/event_log.h"
#include "coordinator/job_queue.h"
#include "coordinator/profile_cache.h"
#include "coordinator/state_file.h"
#include "coordinator/step_aggregator.h"
#include "coordinator/worker_registry.h"
#include "job/parsed_job.h"
#include "job/planner.h"

namespace conveyor::coordinator {

// Told about jobs as they change, for metrics. Called with the manager's
// lock held: implementations must be quick and must not call the manager.
class JobObserver {
 public:
  virtual ~JobObserver() = default;
  virtual void OnSubmitted(const v1::Job& job) = 0;
  virtual void OnStep(const v1::Job& job, const v1::StepSummary& step) = 0;
  // The job reached SUCCEEDED, FAILED or CANCELLED.
  virtual void OnFinished(const v1::Job& job) = 0;
  // The job lost a worker and was queued again (restart: {max_restarts}).
  // `reason`: worker_lost, rank_failed, timeout, bad_report or
  // coordinator_restarted; `layout_changed`: an elastic restart laid it out
  // on another number of workers.
  virtual void OnRestarted(const v1::Job& /*job*/, absl::string_view /*reason*/,
                           bool /*layout_changed*/) {}
};

struct JobManagerOptions {
  // A worker silent for longer than this is lost.
  std::chrono::milliseconds heartbeat_timeout{10000};
  // Two Ticks further apart than this (the daemon ticks every 100 ms) mean
  // the coordinator itself was not running: stopped, descheduled, a paused
  // VM. That time is not counted against the workers' heartbeats, which
  // queued up unread meanwhile. Zero: never.
  std::chrono::milliseconds stall_threshold{2000};
  // How long workers may take to load a program and report ready.
  std::chrono::milliseconds prepare_timeout{120000};
  // How long a job reported failed by a worker waits for a lost worker to
  // explain the failure (see the header comment).
  std::chrono::milliseconds failure_grace{500};
  // The data plane's receive timeout, sent in each program.
  std::chrono::milliseconds recv_timeout{30000};
  // Jobs waiting in the queue at most; more is RESOURCE_EXHAUSTED.
  int max_queued_jobs = 1000;
  // Events kept per job for WatchJob (older step events are dropped; a
  // watcher that falls behind skips them).
  int max_events_per_job = 4096;
  // Step timelines kept per job for GetTrace: the newest this many steps,
  // and, once jobs have ended, only for the newest this many ended jobs (a
  // long-lived coordinator's memory must not grow with its history).
  int trace_steps = 16;
  int trace_finished_jobs = 32;
  // Once a job has ended it keeps only its newest this many events, and only
  // the newest max_finished_jobs ended jobs are kept at all (older ones are
  // NOT_FOUND): the coordinator's memory stays bounded however many jobs it
  // has run.
  int events_per_finished_job = 16;
  int max_finished_jobs = 1000;
  // Timed runs per layer and action when a `stages: auto` job's layers are
  // profiled.
  int profile_repetitions = 3;
  // Profiles kept for later jobs of the same model, microbatch size and
  // device (the oldest is dropped first).
  int max_cached_profiles = 64;
  // Optional; outlives the manager.
  JobObserver* observer = nullptr;
  // Optional; where job records are kept (see the header comment). Outlives
  // the manager.
  const StateFile* state_file = nullptr;
  // Fault injection for a test of a coordinator killed between a step's
  // last stage file and its manifest: CommitCheckpoint of this step (0:
  // none) stands still this long first, holding the manager. Never set in
  // production.
  int64_t fault_commit_step = 0;
  std::chrono::milliseconds fault_commit_delay{0};
  // Version a worker must report (besides proto::kProtocolVersion).
  std::string version;
  std::function<std::chrono::steady_clock::time_point()> clock =
      std::chrono::steady_clock::now;
};

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

  struct JobRecord {
    JobRecord(int max_events, int trace_steps)
        : steps(trace_steps), events(max_events) {}

    // Why FailOrRestart must not restart the job, empty when it may: a
    // worker failed to prepare it for a reason of the job's own
    // (InvalidArgument, ResourceExhausted, ...), or attempts keep losing
    // workers before their first step (the job may be what kills them).
    std::string no_restart;
    // Attempts in a row that lost a worker before completing a step, and
    // whether the current attempt has completed one.
    int attempts_lost_before_a_step = 0;
    bool stepped = false;
    // False from SubmitJob until the state file holds the job: Schedule
    // does not place it, so a submission that cannot be made durable is
    // withdrawn without a trace.
    bool durable = true;
    v1::Job info;
    job::JobPlan plan;
    // The job file, parsed once (at submission or restore): every plan of
    // the job starts from its spec, every manifest records its hashes. An
    // ended job keeps only its names and hashes.
    job::ParsedJob parsed;
    uint64_t number = 0;
    std::string secret;
    // Which ranks of the current attempt are ready, and which ended.
    AttemptRanks ranks;
    // Step reports until every rank has reported, and the newest
    // trace_steps steps' timelines for GetTrace.
    StepAggregator steps;
    StepRates rates;
    TimePoint prepare_deadline;
    // stages: auto: waiting for rank 0's ModelProfile, cached under
    // profile_key. Until programs_sent only rank 0 may have heard of the
    // job (when profile_requested).
    bool profiling = false;
    bool profile_requested = false;
    bool programs_sent = false;
    std::string profile_key;
    std::string profile_device;
    // A worker reported failure; the job fails at failure_deadline.
    bool failing = false;
    std::string failure;
    TimePoint failure_deadline;
    EventLog events;
    // The workers the job file's layout needs, and (elastic) the workers the
    // job is laid out for instead; 0: the file's layout.
    int file_ranks = 0;
    int relayout_ranks = 0;
    // Why the next attempt's layout differs from the last one's (elastic),
    // for Job.layouts; empty: it does not.
    std::string layout_reason;
    // Why the job was restarted, while it waits in the queue for that
    // restart (not for a drain, nor after a coordinator restart); empty
    // otherwise. See ReexamineRestarts.
    std::string restart_reason;
    // Where the current attempt starts; nullopt: from the init.
    std::optional<checkpoint::ResumePoint> resume;
    // The newest step this manager committed for the job.
    std::optional<checkpoint::ResumePoint> committed;
    // Checkpoint files reported per step, until all are in.
    CheckpointCollector checkpoints;
    // Restarts so far; part of the data plane's job number, so a restarted
    // attempt can never be confused with the one before it.
    int attempt = 0;
    // A step could not be appended to metrics.jsonl (logged once).
    bool metrics_log_failed = false;
    // A drain of this attempt (DrainWorker): the ranks' DrainPoints until
    // all are in (by `drain_deadline`), then the step every rank stops after.
    bool draining = false;
    std::string drain_reason;
    std::map<int, int64_t> drain_points;
    int64_t drain_step = 0;
    TimePoint drain_deadline;
  };

  // HandleWorkerMessage's work, under mu_ (taken here).
  absl::Status Dispatch(const std::string& worker_id,
                        const v1::WorkerMessage& message);
  JobRecord* FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // 16 random bytes, hex: the data plane's per-job handshake secret. Only
  // the job's workers receive it, so a stray or hostile connection to a
  // worker's data port cannot join the job.
  static std::string MakeSecret();
  // A new record for job `number`, which must not have one.
  JobRecord& AddJobRecord(uint64_t number) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void TickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a write of the state file has held the records as they were at
  // change number `change` (always, without a state file).
  bool PersistedThrough(uint64_t change) ABSL_LOCKS_EXCLUDED(persist_mu_, mu_);
  // Writes `state` (CancelJob's write-ahead, or Persist's snapshot) and
  // keeps StateFileError current. The Locked form needs persist_mu_.
  absl::Status SaveState(const v1::CoordinatorState& state)
      ABSL_LOCKS_EXCLUDED(persist_mu_, mu_);
  absl::Status SaveStateLocked(const v1::CoordinatorState& state)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Discounts a stall of the coordinator since the last Tick from every
  // worker's silence (JobManagerOptions::stall_threshold).
  void DiscountStall(TimePoint now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Place(JobRecord& job, const std::vector<WorkerRecord*>& workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobProgram MakeProgram(const JobRecord& job, int rank) const;
  // Sends every rank its program (the job is placed and cut).
  void SendPrograms(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cuts a stages: auto job from `profile`, then sends the programs; fails
  // the job when no cut fits.
  void ApplyProfile(JobRecord& job, std::vector<engine::LayerProfile> profile,
                    bool from_cache) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnProfile(WorkerRecord& w, const v1::ModelProfile& profile)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void OnReady(WorkerRecord& w, const v1::JobReady& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnStep(WorkerRecord& w, const v1::StepReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnEnded(WorkerRecord& w, const v1::JobEnded& ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCheckpoint(WorkerRecord& w, const v1::CheckpointSaved& saved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the manifest of `step` from its stages' files.
  void CommitCheckpoint(JobRecord& job, int64_t step,
                        const std::map<int, v1::StageFile>& files)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkLost(WorkerRecord& w, const std::string& observed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Drains (coordinator/job_manager_drain.cc). Marks `w` draining and moves
  // its job, or tells it to leave when it holds none.
  void StartDrain(WorkerRecord& w, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the job's ranks for their DrainPoints (the job is RUNNING).
  void DrainJob(JobRecord& job, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDrainPoint(WorkerRecord& w, const v1::DrainPoint& point)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every rank has answered or ended: sends the step to stop after.
  void MaybeSendDrainStep(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every rank stopped after the drain step: queue the job to resume there.
  void FinishDrain(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A draining worker that holds no job leaves (once).
  void LeaveIfDrained(WorkerRecord& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Moves a job to a final state, tells its workers to stop (unless they
  // all ended already) and records the event.
  void Finish(JobRecord& job, v1::JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A placed job that failed for `reason`: restarts it when its policy
  // allows, else Finish(FAILED).
  // `kind` labels the restart (Observer::OnRestarted).
  void FailOrRestart(JobRecord& job, const std::string& reason,
                     absl::string_view kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailOrRestart's restart, once its policy allows one: queues the job at
  // the head for the live workers (elastic) or the file's count. A drained
  // job (`drained`) does not count a restart and, with too few workers,
  // waits in the queue instead of failing.
  // (`reason` by value: callers pass the job's own failure or drain
  // reason, which the next attempt clears.)
  void Requeue(JobRecord& job, std::string reason, absl::string_view kind,
               bool drained) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic: lays `job` out on `ranks` workers, or fewer down to its
  // restart.elastic.min_workers when its schedule cannot plan on `ranks`.
  // False when no count works: the job is then FAILED, naming why.
  bool LayOutOn(JobRecord& job, int ranks, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every restarted job still queued is checked against the live workers
  // (Schedule, so after every loss, join and drain): one that its rules no
  // longer let run on them is laid out anew (elastic) or FAILED, naming
  // why, rather than waiting for workers that are gone.
  void ReexamineRestarts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `message` to each rank of the job's attempt that has not ended
  // and whose worker still holds the job.
  void SendToRunningRanks(JobRecord& job, const v1::CoordinatorMessage& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the job's workers that have not ended to cancel, freeing at once
  // those that never heard of it (see Finish).
  void StopWorkers(JobRecord& job, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Clears a placed job's placement and per-attempt state for its next
  // attempt, which resumes from the newest committed step (or where the
  // job started), and counts the restart for `reason`.
  void PrepareNextAttempt(JobRecord& job, const std::string& reason,
                          bool counted = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills the fields of job.info that job.plan decides (stages, schedule,
  // sizes), and the rates derived from it.
  void DescribePlan(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Plans the job again from its parsed file (resuming with job.resume's
  // cut, on relayout_ranks workers when elastic), and describes the plan in
  // job.info.
  absl::Status Replan(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic: re-plans `job` onto `ranks` workers (its file's layout when
  // ranks is the file's count), resuming from its checkpoint on the new
  // layout. On error the job keeps its plan.
  absl::Status Relayout(JobRecord& job, int ranks, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the plan's layout to Job.layouts when it differs from the last.
  void RecordLayout(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::CoordinatorState Snapshot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetState(JobRecord& job, v1::JobState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job records changed: the state file is due for a write.
  void MarkChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++changes_; }
  // Job.queue_reason of the queued `job` at `position` (1: the head), with
  // `live` workers that have its devices_per_stage.
  std::string WhyQueued(JobRecord& job, int position, int live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddEvent(JobRecord& job, const v1::StepSummary* step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWorker(WorkerRecord& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "worker-2 (local-1, rank 1, stages 1,3)".
  std::string DescribeWorker(const WorkerRecord& w) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateQueuePositions() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t NowUnixMs() const;

  const JobManagerOptions options_;
  // Taken before mu_, never while holding it: one writer of the state file at
  // a time, each writing a snapshot at least as new as the last one.
  Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  uint64_t persisted_changes_ ABSL_GUARDED_BY(persist_mu_) = 0;
  // Its own mutex, so that reading it never waits behind a slow write.
  mutable Mutex health_mu_;
  std::string state_file_error_ ABSL_GUARDED_BY(health_mu_);
  mutable Mutex mu_;
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar events_cv_;
  uint64_t event_count_ ABSL_GUARDED_BY(mu_) = 0;  // See WaitForAnyEvent.
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // When Tick last ran; nullopt before the first.
  std::optional<TimePoint> last_tick_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  // Keyed by the number in "worker-<n>" and "job-<n>": registration and
  // submission order.
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  JobQueue queue_ ABSL_GUARDED_BY(mu_);
  ProfileCache profiles_ ABSL_GUARDED_BY(mu_);
  // The newest transfer latency measured on each profiled device
  // (ModelProfile.transfer_seconds), for ChooseStages.
  std::map<std::string, double> transfer_seconds_ ABSL_GUARDED_BY(mu_);
  // Ended jobs, oldest first (max_finished_jobs).
  std::deque<uint64_t> finished_jobs_ ABSL_GUARDED_BY(mu_);
  // Ended jobs that still hold timelines, oldest first.
  std::deque<uint64_t> finished_traces_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_JOB_MANAGER_H_
