// JobRun: one job as the coordinator runs it: its record (JobRecord: the
// Job it reports, its parsed file and plan, and the state of its current
// attempt) and everything that happens to it once it is placed: its ranks'
// ready, step, checkpoint, drain and end reports, the commit of each
// checkpoint, its failure or restart (queued again, perhaps laid out anew
// on another number of workers), its drain, and its end.
//
// A JobRun does not place itself (coordinator/placer.h does), save itself
// (coordinator/job_store.h) or own the workers and the queue: what it needs
// of the manager it reaches through a JobRunContext, which a test can fake.
//
// Not thread-safe: a JobRun lives in its JobManager's map, and every method
// is called with the manager's lock held (JobManager::mu_), as is every
// JobRunContext method it calls. The context must outlive the JobRun.
#ifndef CONVEYOR_COORDINATOR_JOB_RUN_H_
#define CONVEYOR_COORDINATOR_JOB_RUN_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/resume.h"
#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/attempt_ranks.h"
#include "coordinator/checkpoint_collector.h"
#include "coordinator/checkpoint_commits.h"
#include "coordinator/event_log.h"
#include "coordinator/job_manager_options.h"
#include "coordinator/job_queue.h"
#include "coordinator/step_aggregator.h"
#include "coordinator/worker_registry.h"
#include "job/parsed_job.h"
#include "job/planner.h"

namespace conveyor::coordinator {

class JobRun;

// What a JobRun (and the Placer) needs of the JobManager that holds it.
// Every method is called with the manager's lock held.
class JobRunContext {
 public:
  virtual ~JobRunContext() = default;

  virtual const JobManagerOptions& options() const = 0;
  virtual WorkerRegistry& workers() = 0;
  virtual JobQueue& queue() = 0;
  // Job records changed: the state file is due for a write of every
  // record (prefer MarkJobChanged(job), which writes only that job's).
  virtual void MarkChanged() = 0;
  // Job `job`'s record changed: the state file is due for a write of it.
  virtual void MarkJobChanged(uint64_t job) {
    (void)job;
    MarkChanged();
  }
  // An event was added to job `job`'s log: wakes the manager's watchers.
  virtual void EventAdded(uint64_t job) = 0;
  // Sets every queued job's queue position and reason (Placer).
  virtual void UpdateQueuePositions() = 0;
  // `w` holds no job any more: IDLE, and told to leave when draining.
  virtual void ReleaseWorker(WorkerRecord& w) = 0;
  // `w` is lost (`observed`): its job fails or restarts.
  virtual void MarkLost(WorkerRecord& w, const std::string& observed) = 0;
  // "worker-2 (local-1, rank 1, stages 1,3)".
  virtual std::string DescribeWorker(const WorkerRecord& w) const = 0;
  // `run` has just ended: the manager keeps only the newest ended jobs (and
  // the newest ones' timelines), and may forget older ones, never `run`.
  virtual void OnJobEnded(JobRun& run) = 0;
  // Job `job` queued a commit in `commits`: true when the manager will
  // write it once its lock is released (CheckpointCommits::WriteQueued,
  // then JobRun::ApplyWrittenCommits under the lock); false, the default,
  // has the JobRun write it at once, under the lock.
  virtual bool WriteCommitsOutsideLock(
      uint64_t job, std::shared_ptr<CheckpointCommits> commits) {
    (void)job;
    (void)commits;
    return false;
  }
};

// Wall-clock milliseconds since the epoch, for Job's *_unix_ms fields.
int64_t NowUnixMs();

class JobRun {
 public:
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
    // otherwise. See Placer::ReexamineRestarts.
    std::string restart_reason;
    // Where the current attempt starts; nullopt: from the init.
    std::optional<checkpoint::ResumePoint> resume;
    // The newest step this manager committed for the job.
    std::optional<checkpoint::ResumePoint> committed;
    // Checkpoint files reported per step, until all are in.
    CheckpointCollector checkpoints;
    // Complete steps whose manifests are being written.
    std::shared_ptr<CheckpointCommits> commits =
        std::make_shared<CheckpointCommits>();
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
    // The drain (or, while PLANNING, the requeue) is a preemption for a job
    // of higher priority (Placer::Preempt): its workers are on their way to
    // that job, and its requeue is labelled "preempted". Cleared by the
    // next attempt.
    bool preempting = false;
  };

  // Job `number`'s record, empty but for the number; sized by the
  // context's options (max_events_per_job, trace_steps).
  JobRun(JobRunContext& context, uint64_t number);

  JobRun(const JobRun&) = delete;
  JobRun& operator=(const JobRun&) = delete;

  JobRecord& job() { return job_; }
  const JobRecord& job() const { return job_; }

  // 16 random bytes, hex: the data plane's per-job handshake secret. Only
  // the job's workers receive it, so a stray or hostile connection to a
  // worker's data port cannot join the job.
  static std::string MakeSecret();

  // ---- Reports of the job's ranks (coordinator/job_run.cc) ----
  // The manager found the job by the report's job id; a report from a
  // worker that does not hold the job, or of a state the job has left, is
  // ignored (it is late).

  void OnReady(WorkerRecord& w, const v1::JobReady& ready);
  void OnStep(WorkerRecord& w, const v1::StepReport& report);
  // `w` holds this job (the manager checked) and ended it: frees `w`
  // first.
  void OnEnded(WorkerRecord& w, const v1::JobEnded& ended);
  void OnCheckpoint(WorkerRecord& w, const v1::CheckpointSaved& saved);

  // Fails or restarts the job when one of its deadlines passed by `now`:
  // prepare_timeout, a reported failure's grace, or an unanswered drain.
  void CheckDeadlines(TimePoint now);

  // Writes the commits still queued (waiting for one being written
  // elsewhere) and applies every written one: the decisions that read
  // job.committed call it first.
  void SettleCommits();
  // Applies the commits written so far (CheckpointCommits::TakeWritten):
  // job.committed, last_checkpoint_step and an event for each; a failed
  // one ends the job FAILED, naming the step.
  void ApplyWrittenCommits();

  // The timelines every rank reported for step `step` (0: the newest);
  // NotFound as JobManager::GetTrace.
  absl::StatusOr<v1::Trace> Trace(int64_t step) const;

  // ---- States (coordinator/job_run.cc; restarts in job_run_restart.cc) ----

  // Moves the job to a final state, tells its workers to stop (unless they
  // all ended already) and records the event.
  void Finish(v1::JobState state, const std::string& message);
  // A placed job that failed for `reason`: restarts it when its policy
  // allows, else Finish(FAILED). `kind` labels the restart
  // (JobObserver::OnRestarted).
  void FailOrRestart(const std::string& reason, absl::string_view kind);
  // FailOrRestart's restart, once its policy allows one: queues the job at
  // the head for the live workers (elastic) or the file's count. A drained
  // job (`drained`) does not count a restart and, with too few workers,
  // waits in the queue instead of failing.
  // (`reason` by value: callers pass the job's own failure or drain
  // reason, which the next attempt clears.)
  void Requeue(std::string reason, absl::string_view kind, bool drained);
  // Clears a placed job's placement and per-attempt state for its next
  // attempt, which resumes from the newest committed step (or where the
  // job started), and counts the restart for `reason`.
  void PrepareNextAttempt(const std::string& reason, bool counted = true);
  // A job queued for a restart (restart_reason), checked against the live
  // workers: when its rules no longer let it run on them, it is laid out
  // anew (elastic) or FAILED, naming why, rather than waiting for workers
  // that are gone. Placer::ReexamineRestarts calls it after every change of
  // the fleet.
  void ReexamineRestart();
  // Checks the move (job/job_states.h), records the event and marks the
  // records changed.
  void SetState(v1::JobState state);
  // Appends the job as it is now (and `step`'s summary, if any) to its
  // event log.
  void AddEvent(const v1::StepSummary* step);
  // Sends `message` to each rank of the job's attempt that has not ended
  // and whose worker still holds the job.
  void SendToRunningRanks(const v1::CoordinatorMessage& message);
  // Tells the job's workers that have not ended to cancel, freeing at once
  // those that never heard of it (see Finish).
  void StopWorkers(const std::string& reason);

  // ---- Drain (coordinator/job_run_drain.cc) ----

  // Asks the job's ranks for their DrainPoints (the job is RUNNING).
  void DrainJob(const std::string& reason);
  void OnDrainPoint(WorkerRecord& w, const v1::DrainPoint& point);

  // ---- Plan and layout (coordinator/job_run_restart.cc) ----

  // Fills the fields of job.info that job.plan decides (stages, schedule,
  // sizes), and the rates derived from it.
  void DescribePlan();
  // Plans the job again from its parsed file (resuming with job.resume's
  // cut, on relayout_ranks workers when elastic), and describes the plan in
  // job.info.
  absl::Status Replan();
  // Elastic: lays the job out on `ranks` workers, or fewer down to its
  // restart.elastic.min_workers when its schedule cannot plan on `ranks`.
  // False when no count works: the job is then FAILED, naming why.
  bool LayOutOn(int ranks, const std::string& reason);
  // Appends the plan's layout to Job.layouts when it differs from the last.
  void RecordLayout();

 private:
  // The rank of worker `w` in the current attempt; the attempt's size when
  // it has none.
  int RankOf(const WorkerRecord& w) const;
  // Queues the manifest of `step`, from its stages' files, for writing.
  void CommitCheckpoint(int64_t step,
                        const std::map<int, v1::StageFile>& files);
  // Once every rank has answered or ended: sends the step to stop after.
  void MaybeSendDrainStep();
  // Every rank stopped after the drain step: queue the job to resume there.
  void FinishDrain();
  // Elastic: re-plans the job onto `ranks` workers (its file's layout when
  // ranks is the file's count), resuming from its checkpoint on the new
  // layout. On error the job keeps its plan.
  absl::Status Relayout(int ranks, const std::string& reason);

  JobRunContext& ctx_;
  JobRecord job_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_JOB_RUN_H_
