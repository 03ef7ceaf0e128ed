// Placer: which queued job runs on which workers, and how it is cut. It
// walks the queue in its order (coordinator/job_queue.h: priority, aging,
// then first come, first served), places each job all or nothing on the
// first idle workers with its devices_per_stage (stage s on the job's rank
// s mod P), has a `stages: auto` job's layers profiled on its first worker
// (or takes a cached profile) and cuts it, sends every rank its program,
// and says for each queued job why it waits (Job.queue_position and
// queue_reason).
//
// Policy (placer_policy.cc; docs/jobs.md "Priority and owner"). A job whose
// owner's placed jobs would hold more workers than the owner's quota
// (--owner-quota) waits, and is passed over: it waits for its owner's jobs,
// not for the cluster, so it does not hold up other owners' jobs behind it.
// The first job that waits for workers holds up every job behind it (no
// backfill: a large job is never starved by small ones slipping past). When
// that job cannot be placed and draining running jobs of strictly lower
// priority would free enough workers of its kind (counting those already on
// their way), the fewest, lowest of them are preempted
// (coordinator/scheduling_policy.h ChooseVictims): drained at their next
// step boundary with a checkpoint and queued again to resume there with
// nothing redone (coordinator/job_run_drain.cc), never killed. Priority,
// not aging, decides preemption, so a job is never preempted for one of
// equal priority and aging cannot make jobs preempt each other in turn.
// A running job without checkpoint.dir has nothing to resume from and is
// never preempted.
//
// Its boundary: the Placer decides placement and sends what it takes to
// start an attempt (ProfileModel, PrepareJob). What happens to the attempt
// after that (its reports, failure, restart, drain and end) is the job's
// own (coordinator/job_run.h); the workers, the queue and the job records
// belong to the JobManager, which lends them to the Placer.
//
// Not thread-safe: the JobManager holds it under its lock, and every method
// is called with that lock held, as are the JobRunContext's methods it
// calls. The context and the job map must outlive the Placer.
#ifndef CONVEYOR_COORDINATOR_PLACER_H_
#define CONVEYOR_COORDINATOR_PLACER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/job_run.h"
#include "coordinator/profile_cache.h"
#include "coordinator/worker_registry.h"
#include "engine/profiler.h"

namespace conveyor::coordinator {

class Placer {
 public:
  // Places the jobs of `jobs` (by job number) that `context.queue()` holds,
  // on `context.workers()`. Keeps options().max_cached_profiles profiles.
  Placer(JobRunContext& context, std::map<uint64_t, JobRun>& jobs);

  Placer(const Placer&) = delete;
  Placer& operator=(const Placer&) = delete;

  // Re-examines the restarted jobs (ReexamineRestarts), then places queued
  // jobs from the head while enough workers are idle, and updates every
  // queued job's position and reason. Called after every change of the
  // fleet or the queue.
  void Schedule();

  // Rank 0 of the PLANNING `job` (the manager found it by the profile's job
  // id) reported its layers' profile: caches it, then cuts the job and
  // sends the programs; fails the job for a malformed profile. Ignored when
  // late (the job is not profiling, or `w` is not its rank 0).
  void OnProfile(JobRun& job, WorkerRecord& w, const v1::ModelProfile& profile);

  // Sets Job.queue_position and queue_reason of every queued job.
  void UpdateQueuePositions();

  // The program of rank `rank` of the placed and cut `job`.
  v1::JobProgram MakeProgram(const JobRun& job, int rank) const;

 private:
  // Every restarted job still queued is checked against the live workers
  // (JobRun::ReexamineRestart): one that its rules no longer let run on
  // them is laid out anew (elastic) or FAILED, naming why, rather than
  // waiting for workers that are gone.
  void ReexamineRestarts();
  // Gives `job` the idle `workers` (one per rank) and starts its attempt:
  // a profile request, or its programs.
  void Place(JobRun& job, const std::vector<WorkerRecord*>& workers);
  // Sends every rank its program (the job is placed and cut).
  void SendPrograms(JobRun& job);
  // Cuts a stages: auto job from `profile`, then sends the programs; fails
  // the job when no cut fits.
  void ApplyProfile(JobRun& job, std::vector<engine::LayerProfile> profile,
                    bool from_cache);
  // ---- Policy (placer_policy.cc) ----

  // Workers held by each owner's placed (PLANNING or RUNNING) jobs.
  std::map<std::string, int> HeldByOwner() const;
  // The owner's quota when `job` would take its owner past it; nullopt when
  // it fits (or has no owner, or the owner no quota).
  std::optional<int> OverQuota(const JobRun& job,
                               const std::map<std::string, int>& held) const;
  // Workers with at least `devices` devices that are BUSY but will soon be
  // free for the queue: winding down from an attempt that ended or was
  // requeued, or held by a job being preempted. Draining workers leave
  // instead and are not counted.
  int WorkersComing(int64_t devices);
  // `blocked` (the first queued job that waits for workers) preempts
  // lower-priority jobs when that frees enough workers (see above).
  void Preempt(JobRun& blocked);
  // Why the queued `job` waits (Job.queue_reason); empty when it is
  // placed at the next pass. `live` and `idle`: workers with its
  // devices_per_stage; `blocked`: the first job ahead of it that waits for
  // workers, if any.
  std::string WhyQueued(const JobRun& job, int live, int idle,
                        const JobRun* blocked,
                        const std::map<std::string, int>& held);

  JobRunContext& ctx_;
  std::map<uint64_t, JobRun>& jobs_;
  ProfileCache profiles_;
  // The newest transfer latency measured on each profiled device
  // (ModelProfile.transfer_seconds), for ChooseStages.
  std::map<std::string, double> transfer_seconds_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_PLACER_H_
