// JobManager (coordinator/job_manager.h), continued: the jobs' side (the
// Coordinator service's submission, queries, cancellation and watching),
// the state file (Persist) and Restore.
#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/directory.h"
#include "checkpoint/resume.h"
#include "common/printable.h"
#include "coordinator/ids.h"
#include "coordinator/job_manager.h"
#include "job/job_spec.h"
#include "job/parsed_job.h"
#include "job/planner.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

using job::JobPlan;
using job::PlanJob;

namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

// ---------------------------------------------------------------------------
// Jobs.

absl::StatusOr<v1::Job> JobManager::SubmitJob(
    const v1::SubmitJobRequest& request) {
  if (static_cast<int64_t>(request.yaml().size()) > job::kMaxJobFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job file is ", request.yaml().size(),
                     " bytes; the limit is ", job::kMaxJobFileBytes));
  }
  const std::string file_name =
      request.file_name().empty() ? "job.yaml" : request.file_name();
  absl::StatusOr<job::ParsedJob> parsed =
      job::ParseJob(request.yaml(), file_name, request.base_dir());
  if (!parsed.ok()) return parsed.status();
  // The plan's copy: a checkpoint's cut changes it, never the parsed file.
  job::JobSpec spec = parsed->spec;
  // Outside the lock: finding the checkpoint reads the filesystem.
  std::optional<checkpoint::ResumePoint> resume;
  if (spec.resume.kind != job::ResumeSpec::Kind::kNone) {
    absl::StatusOr<checkpoint::ResumePoint> point = checkpoint::FindResumePoint(
        spec.resume, spec.checkpoint.dir, parsed->config_hash,
        parsed->training_hash, parsed->yaml);
    if (!point.ok()) return point.status();
    for (const std::string& note : point->notes) {
      SPDLOG_INFO("'{}' resumes from {}: {}", Printable(spec.name),
                  point->step_dir, note);
    }
    if (absl::Status s = checkpoint::AdoptCheckpointCut(*point, spec); !s.ok())
      return s;
    resume = *std::move(point);
  }
  absl::StatusOr<JobPlan> plan = PlanJob(std::move(spec));
  if (!plan.ok()) return plan.status();
  if (resume.has_value()) {
    if (absl::Status s = checkpoint::CheckResumeFitsPlan(*resume, *plan);
        !s.ok()) {
      return s;
    }
  }
  const std::string checkpoint_dir = plan->job.checkpoint.dir;
  if (!checkpoint_dir.empty()) {
    if (absl::Status s = checkpoint::CheckNothingNewer(
            checkpoint_dir, resume.has_value() ? resume->step : 0);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = checkpoint::CheckCheckpointDirWritable(checkpoint_dir);
        !s.ok()) {
      return s;
    }
  }

  v1::Job submitted;
  uint64_t change = 0;  // changes_ once the job is recorded.
  {
    MutexLock lock(mu_);
    if (shutdown_) return absl::UnavailableError("coordinator shutting down");
    const int64_t devices = plan->job.pipeline.devices_per_stage;
    const int live = workers_.Live(devices);
    if (plan->num_ranks > live && devices > 1) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "job '%s' needs %d workers with at least %d devices each "
          "(pipeline.devices_per_stage at %s) but the cluster has %d live "
          "worker(s) with that many; start workers with more devices "
          "(--devices cuda:0,1,...) or lower devices_per_stage",
          plan->job.name, plan->num_ranks, devices,
          plan->job.pipeline.devices_per_stage_where.ToString(), live));
    }
    if (plan->num_ranks > live) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "job '%s' needs %d workers (%d stages, %d per worker) but the "
          "cluster has %d live worker(s); start more workers or use fewer "
          "stages",
          plan->job.name, plan->num_ranks, plan->num_stages,
          plan->virtual_stages, live));
    }
    // Two live jobs writing one directory would overwrite each other's steps.
    for (const auto& [n, run] : jobs_) {
      const v1::Job& other = run.job().info;
      if (!checkpoint_dir.empty() && !proto::IsTerminal(other.state()) &&
          other.checkpoint_dir() == checkpoint_dir) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint.dir ", checkpoint_dir, " is in use by ", other.id(),
            " ('", other.name(), "'); give this job another checkpoint.dir"));
      }
    }
    // A job its owner's quota can never hold would wait forever.
    if (const std::string& owner = plan->job.owner; !owner.empty()) {
      const auto quota = options_.owner_quotas.find(owner);
      if (quota != options_.owner_quotas.end() &&
          plan->num_ranks > quota->second) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "job '%s' needs %d workers but owner '%s' has a quota of %d "
            "(--owner-quota); use fewer stages or ask for a larger quota",
            plan->job.name, plan->num_ranks, owner, quota->second));
      }
    }
    if (queue_.size() >= options_.max_queued_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the job queue is full (", options_.max_queued_jobs,
                       " jobs waiting); retry later"));
    }
    const uint64_t number = next_job_++;
    JobRun& run = AddJobRecord(number);
    JobRun::JobRecord& job = run.job();
    job.secret = JobRun::MakeSecret();
    job.parsed = *std::move(parsed);
    job.plan = *std::move(plan);
    job.file_ranks = job.plan.num_ranks;
    job.resume = std::move(resume);
    v1::Job& info = job.info;
    info.set_id(JobId(number));
    info.set_name(job.plan.job.name);
    info.set_created_unix_ms(NowUnixMs());
    info.set_priority(job.plan.job.priority);
    info.set_owner(job.plan.job.owner);
    run.DescribePlan();
    if (job.resume.has_value()) {
      info.set_steps_done(job.resume->step);
      info.set_resumed_from_step(job.resume->step);
      info.set_resumed_from(job.resume->step_dir);
      for (const std::string& note : job.resume->notes) {
        info.add_resume_notes(note);
      }
    }
    info.set_state(v1::QUEUED);
    SPDLOG_INFO("{} '{}' queued: {} over {} worker(s)", info.id(),
                Printable(info.name()), info.schedule(), info.num_workers());
    job.durable = false;
    queue_.Add(number, info.priority(), options_.clock());
    placer_.UpdateQueuePositions();
    run.AddEvent(nullptr);
    MarkJobChanged(number);
    change = changes_;
    submitted = job.info;
  }
  // Before answering: an acknowledged submission survives a crash. One the
  // state file cannot hold is withdrawn (it was never placed) and refused,
  // or a restart would forget it and give its id to another job. Durable
  // means some write since held it (perhaps a Tick's), whatever this one
  // returned.
  const absl::Status persisted = Persist();
  const bool durable = store_.PersistedThrough(change);
  MutexLock lock(mu_);
  const auto it = jobs_.find(JobNumber(submitted.id()));
  if (it == jobs_.end()) return submitted;  // Already forgotten (cannot be).
  JobRun::JobRecord& job = it->second.job();
  if (!durable) {
    if (job.info.state() == v1::QUEUED) {
      const uint64_t number = job.number;
      queue_.Remove(number);
      jobs_.erase(it);
      placer_.UpdateQueuePositions();
      // The failed write may still have landed its record: the next write
      // (a full one, JobStore::Persist) holds the job as withdrawn.
      MarkJobChanged(number);
    }
    return absl::UnavailableError(absl::StrCat(
        "the job was not accepted: the coordinator cannot write its state "
        "file (",
        persisted.message(), "); retry once it can"));
  }
  job.durable = true;
  if (options_.observer != nullptr) options_.observer->OnSubmitted(job.info);
  placer_.Schedule();
  return submitted;
}

absl::StatusOr<v1::Job> JobManager::GetJob(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = jobs_.find(JobNumber(id));
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  }
  return it->second.job().info;
}

std::vector<v1::Job> JobManager::ListJobs() const {
  MutexLock lock(mu_);
  std::vector<v1::Job> out;
  for (const auto& [number, run] : jobs_) out.push_back(run.job().info);
  return out;
}

absl::StatusOr<v1::Job> JobManager::CancelJob(const std::string& id,
                                              const std::string& reason) {
  // Written ahead: the state file first holds the job as cancelled, and
  // only then is it cancelled here. A cancel the file cannot hold is not
  // applied at all, so what the caller is told, what this coordinator
  // does and what a restarted one would do agree.
  // Only the job's record is written ahead (and the queue without it).
  v1::CoordinatorState ahead;
  uint64_t number = 0;
  {
    MutexLock lock(mu_);
    JobRun* job = FindJob(id);
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
    }
    if (proto::IsTerminal(job->job().info.state())) return job->job().info;
    number = job->job().number;
    std::vector<uint64_t> removed;
    ahead = JobStore::Changes(options_.version, next_job_, jobs_, queue_,
                              {number}, &removed);
    for (v1::JobRecordState& saved : *ahead.mutable_jobs()) {
      saved.mutable_info()->set_state(v1::CANCELLED);
      saved.mutable_info()->set_message(reason);
      saved.mutable_info()->set_ended_unix_ms(NowUnixMs());
      saved.mutable_info()->set_queue_position(0);
    }
    auto& queue = *ahead.mutable_queue();
    queue.erase(std::remove(queue.begin(), queue.end(), number), queue.end());
  }
  if (absl::Status s = store_.SaveAhead(ahead); !s.ok()) {
    {
      // Due for a write (a full one, JobStore::SaveAhead): the state file
      // must end up holding the job as it really is, not cancelled.
      MutexLock lock(mu_);
      MarkJobChanged(number);
    }
    return absl::UnavailableError(absl::StrCat(
        id,
        " was not cancelled: the coordinator could not make the change "
        "durable (it cannot write its state file: ",
        s.message(), "); retry the cancel once it can"));
  }
  v1::Job cancelled;
  {
    MutexLock lock(mu_);
    JobRun* job = FindJob(id);
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
    }
    if (!proto::IsTerminal(job->job().info.state())) {
      job->Finish(v1::CANCELLED, reason);
      placer_.Schedule();
    }
    cancelled = job->job().info;
  }
  // What else changed meanwhile; the cancel itself is held already.
  (void)Persist();
  return cancelled;
}

std::vector<v1::Worker> JobManager::ListWorkers() const {
  MutexLock lock(mu_);
  const TimePoint now = options_.clock();
  std::vector<v1::Worker> out;
  for (const WorkerRecord* w : workers_.All()) {
    out.push_back(w->info);
    out.back().set_seconds_since_heartbeat(Seconds(now - w->last_seen));
  }
  return out;
}

absl::StatusOr<v1::Trace> JobManager::GetTrace(const std::string& id,
                                               int64_t step) const {
  MutexLock lock(mu_);
  auto it = jobs_.find(JobNumber(id));
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  }
  return it->second.Trace(step);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobManager::WaitEvents(
    const std::string& id, int64_t* cursor,
    std::chrono::steady_clock::time_point deadline, bool* done) {
  MutexLock lock(mu_);
  *done = false;
  const uint64_t number = JobNumber(id);
  auto available =
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> JobRun::JobRecord* {
    auto it = jobs_.find(number);
    return it == jobs_.end() ? nullptr : &it->second.job();
  };
  JobRun::JobRecord* job = available();
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  }
  // A new watcher starts at the latest event: the job as it is now.
  *cursor = job->events.Normalize(*cursor);
  // The job is looked up again on every wake-up: while the lock was free it
  // may have ended and, much later, been forgotten (max_finished_jobs).
  events_cv_.WaitUntil(mu_, deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    job = available();
    return shutdown_ || job == nullptr || *cursor < job->events.end();
  });
  if (shutdown_) return absl::CancelledError("coordinator shutting down");
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job '", id, "' was forgotten"));
  }
  std::vector<v1::JobEvent> out = job->events.Read(cursor);
  *done = proto::IsTerminal(job->info.state());
  return out;
}

uint64_t JobManager::WaitForAnyEvent(
    uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(mu_);
  events_cv_.WaitUntil(mu_, deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return event_count_ != seen;
  });
  return event_count_;
}

std::optional<std::vector<std::string>> JobManager::JobsWithEventsSince(
    uint64_t seen, uint64_t* now) {
  MutexLock lock(mu_);
  *now = event_count_;
  // Forgotten already (the deque keeps the newest kRecentEvents), or not
  // a count this manager gave.
  if (seen > event_count_ ||
      (event_count_ > seen &&
       (recent_events_.empty() || recent_events_.front().first > seen + 1))) {
    return std::nullopt;
  }
  std::set<uint64_t> jobs;
  for (auto it = recent_events_.rbegin();
       it != recent_events_.rend() && it->first > seen; ++it) {
    if (it->second == kEveryJob) return std::nullopt;
    jobs.insert(it->second);
  }
  std::vector<std::string> ids;
  ids.reserve(jobs.size());
  for (uint64_t job : jobs) ids.push_back(JobId(job));
  return ids;
}

// ---------------------------------------------------------------------------
// The state file.

absl::Status JobManager::Persist() {
  return store_.Persist([&](uint64_t persisted,
                            bool full) -> std::optional<JobStore::Snapshotted> {
    MutexLock lock(mu_);
    if (changes_ == persisted && !full) return std::nullopt;
    JobStore::Snapshotted out{.change = changes_, .full = full || all_changed_};
    // Cleared now: a failed write makes the next one full (`full`).
    if (out.full) {
      out.state = Snapshot();
    } else {
      out.state = JobStore::Changes(options_.version, next_job_, jobs_, queue_,
                                    changed_jobs_, &out.removed);
    }
    all_changed_ = false;
    changed_jobs_.clear();
    return out;
  });
}

std::string JobManager::StateFileError() const {
  return store_.StateFileError();
}

v1::CoordinatorState JobManager::Snapshot() const {
  return JobStore::Snapshot(options_.version, next_job_, jobs_, queue_);
}

absl::Status JobManager::Restore(const v1::CoordinatorState& state) {
  MutexLock lock(mu_);
  if (!jobs_.empty() || !workers_.empty()) {
    return absl::FailedPreconditionError(
        "job records can only be restored before any job or worker");
  }
  absl::StatusOr<JobStore::Restored> restored =
      JobStore::Restore(state, *context_, jobs_);
  if (!restored.ok()) return restored.status();
  next_job_ = std::max(next_job_, restored->next_job);
  RestartRestored(*restored);
  return absl::OkStatus();
}

void JobManager::RestartRestored(const JobStore::Restored& restored) {
  for (uint64_t number : restored.ended) {
    jobs_.at(number).AddEvent(nullptr);
    finished_jobs_.push_back(number);
  }
  // Each kept job's next event: the job as it is now.
  auto start = [&](JobRun& run) {
    run.AddEvent(nullptr);
    if (options_.observer != nullptr) {
      options_.observer->OnSubmitted(run.job().info);
    }
  };
  std::vector<uint64_t> restarted;
  for (uint64_t number : restored.interrupted) {
    JobRun& run = jobs_.at(number);
    JobRun::JobRecord& job = run.job();
    const bool unparsed = restored.unparsed.contains(number);
    // The manifest is written before the record of it: a step committed
    // just before the coordinator went down may be newer on disk than in
    // the state file. The directory is the job's alone (and the step of its
    // configuration), so its newest complete step is the job's.
    if (!job.info.checkpoint_dir().empty() && !unparsed) {
      job::ResumeSpec latest;
      latest.kind = job::ResumeSpec::Kind::kLatest;
      absl::StatusOr<checkpoint::ResumePoint> on_disk =
          checkpoint::FindResumePoint(
              latest, job.info.checkpoint_dir(), job.parsed.config_hash,
              job.parsed.training_hash, job.parsed.yaml);
      const int64_t known =
          std::max<int64_t>(job.committed.has_value() ? job.committed->step : 0,
                            job.resume.has_value() ? job.resume->step : 0);
      if (on_disk.ok() && on_disk->step > known) {
        job.info.set_last_checkpoint_step(on_disk->step);
        job.committed = *std::move(on_disk);
      }
    }
    const std::string at =
        absl::StrCat("the coordinator restarted while the job was ",
                     proto::JobStateName(job.info.state()), " (step ",
                     job.info.steps_done(), ")");
    start(run);
    if (job.committed.has_value() &&
        job.committed->step >= job.info.steps_total()) {
      run.Finish(v1::SUCCEEDED, "");  // Its final step is committed.
      continue;
    }
    if (job.info.restarts() >= job.info.max_restarts()) {
      run.Finish(v1::FAILED,
                 job.committed.has_value()
                     ? absl::StrCat(at, "; step ", job.committed->step,
                                    " is its newest complete checkpoint: "
                                    "submit it again with `resume: latest` "
                                    "to continue")
                     : absl::StrCat(at, "; it had committed no checkpoint"));
      continue;
    }
    run.PrepareNextAttempt(at);
    if (absl::Status s = unparsed ? restored.unparsed.at(number) : run.Replan();
        !s.ok()) {
      run.Finish(v1::FAILED,
                 absl::StrCat(at, "; planning it again failed: ", s.message()));
      continue;
    }
    TakePolicy(job);
    restarted.push_back(number);
    if (options_.observer != nullptr) {
      options_.observer->OnRestarted(job.info, "coordinator_restarted",
                                     /*layout_changed=*/false);
    }
  }
  for (uint64_t number : restored.queued) {
    JobRun& run = jobs_.at(number);
    start(run);
    if (absl::Status s = restored.unparsed.contains(number)
                             ? restored.unparsed.at(number)
                             : run.Replan();
        !s.ok()) {
      run.Finish(v1::FAILED,
                 absl::StrCat("the coordinator restarted and planning the job "
                              "again failed: ",
                              s.message()));
      continue;
    }
    TakePolicy(run.job());
    queue_.Add(number, run.job().info.priority(), options_.clock(),
               std::chrono::milliseconds(run.job().info.queued_wait_ms()));
  }
  // Restarted jobs first among their priority, as a restart after a lost
  // worker would be.
  for (auto it = restarted.rbegin(); it != restarted.rend(); ++it) {
    const v1::Job& info = jobs_.at(*it).job().info;
    queue_.AddFirst(*it, info.priority(), options_.clock(),
                    std::chrono::milliseconds(info.queued_wait_ms()));
  }
  for (uint64_t number : restarted) jobs_.at(number).SetState(v1::QUEUED);
  placer_.UpdateQueuePositions();
  SPDLOG_INFO(
      "restored {} job record(s): {} ended, {} queued, {} restarted after "
      "the coordinator's restart",
      jobs_.size(), restored.ended.size(),
      queue_.size() - static_cast<int>(restarted.size()), restarted.size());
  // The outcomes decided here (FAILED, restarted) are records too.
  MarkChanged();
}

// ---------------------------------------------------------------------------
// Records.

void JobManager::TakePolicy(JobRun::JobRecord& job) {
  // From the job file as parsed again: a record written before these
  // fields existed reads as priority 0 (low) and no owner, which is not
  // what its file says.
  job.info.set_priority(job.parsed.spec.priority);
  job.info.set_owner(job.parsed.spec.owner);
}

JobRun* JobManager::FindJob(const std::string& id) {
  auto it = jobs_.find(JobNumber(id));
  return it == jobs_.end() ? nullptr : &it->second;
}

JobRun& JobManager::AddJobRecord(uint64_t number) {
  return jobs_.try_emplace(number, *context_, number).first->second;
}

void JobManager::ForgetOldJobs(JobRun& ended) {
  const uint64_t finished_number = ended.job().number;
  finished_jobs_.push_back(finished_number);
  if (!ended.job().steps.timelines().empty()) {
    finished_traces_.push_back(finished_number);
    while (static_cast<int>(finished_traces_.size()) >
           options_.trace_finished_jobs) {
      jobs_.at(finished_traces_.front()).job().steps.ClearTimelines();
      finished_traces_.pop_front();
    }
  }
  while (static_cast<int>(finished_jobs_.size()) >
         std::max(1, options_.max_finished_jobs)) {
    const uint64_t oldest = finished_jobs_.front();
    finished_jobs_.pop_front();
    if (oldest == finished_number) continue;  // Cannot happen: max >= 1.
    finished_traces_.erase(
        std::remove(finished_traces_.begin(), finished_traces_.end(), oldest),
        finished_traces_.end());
    jobs_.erase(oldest);
    MarkJobChanged(oldest);  // Its removal.
  }
}

}  // namespace conveyor::coordinator
