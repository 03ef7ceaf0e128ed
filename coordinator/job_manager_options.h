// JobManagerOptions and JobObserver: how a JobManager (coordinator/
// job_manager.h) is configured, and what it tells the metrics about jobs.
// Their own header because the manager's parts (coordinator/job_run.h,
// placer.h, job_store.h) read the same options.
//
// Plain data; the observer is called with the manager's lock held.
#ifndef CONVEYOR_COORDINATOR_JOB_MANAGER_OPTIONS_H_
#define CONVEYOR_COORDINATOR_JOB_MANAGER_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/job_queue.h"
#include "coordinator/scheduling_policy.h"
#include "coordinator/state_file.h"

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
  // `reason`: worker_lost, rank_failed, timeout, bad_report,
  // coordinator_restarted, drained or preempted; `layout_changed`: an elastic
  // restart laid it out on another number of workers.
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
  // explain the failure (see coordinator/job_manager.h).
  std::chrono::milliseconds failure_grace{500};
  // The data plane's receive timeout, sent in each program.
  std::chrono::milliseconds recv_timeout{30000};
  // Jobs waiting in the queue at most; more is RESOURCE_EXHAUSTED.
  int max_queued_jobs = 1000;
  // Events kept per job for WatchJob (older step events are dropped; a
  // watcher that falls behind skips them). Each holds a copy of the job
  // (about 6 KiB in memory for an 8-stage job): at 4096, 512 running jobs
  // would hold 12 GiB once they had run that many steps
  // (bench/fleet_simulator, docs/operations.md "Fleet scale"). A watcher is
  // served within a pass of the WatchHub (tens of ms), so 64 steps of slack
  // is plenty.
  int max_events_per_job = 64;
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
  // Optional; where job records are kept (see coordinator/job_manager.h).
  // Outlives the manager.
  StateFile* state_file = nullptr;
  // Test hook, for a test of a coordinator killed between a step's last
  // stage file and its manifest: the commit of this step (0: none) stands
  // still this long before its manifest is written (without the manager's
  // lock, as every manifest write). Set only by tests, through
  // conveyor-coordinator's hidden --fault-commit-step and
  // --fault-commit-delay-ms; never in production.
  int64_t TEST_fault_commit_step = 0;
  std::chrono::milliseconds TEST_fault_commit_delay{0};
  // Test hook: called with the step before each manifest is written, on
  // the thread that writes it.
  std::function<void(int64_t step)> TEST_before_manifest = {};
  // Version a worker must report (besides proto::kProtocolVersion).
  std::string version = {};
  std::function<std::chrono::steady_clock::time_point()> clock =
      std::chrono::steady_clock::now;

  // Scheduling policy (docs/jobs.md "Priority and owner";
  // coordinator/job_queue.h, scheduling_policy.h). Priority points a
  // queued job gains per minute waited (--aging-per-minute; 0: none).
  double aging_per_minute = JobQueue::kDefaultAgingPerMinute;
  // Workers each owner's placed jobs may hold at once (--owner-quota).
  OwnerQuotas owner_quotas = {};
  // Whether a job that cannot be placed drains running jobs of strictly
  // lower priority for their workers (--no-preemption turns it off).
  bool preemption = true;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_JOB_MANAGER_OPTIONS_H_
