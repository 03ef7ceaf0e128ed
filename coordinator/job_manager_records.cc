// JobManager, continued: the state file: persisting the job records and
// restoring them (coordinator/job_manager.h). One class, one mutex; its files
// by concern.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/ids.h"
#include "coordinator/job_manager.h"
#include "job/job_spec.h"
#include "job/parsed_job.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

using job::JobPlan;
using job::PlanJob;

// ---------------------------------------------------------------------------
// The state file.

absl::Status JobManager::Persist() {
  if (options_.state_file == nullptr) return absl::OkStatus();
  MutexLock persist(persist_mu_);
  v1::CoordinatorState state;
  uint64_t changes = 0;
  {
    MutexLock lock(mu_);
    if (changes_ == persisted_changes_) return absl::OkStatus();
    changes = changes_;
    state = Snapshot();
  }
  // Outside mu_: a slow disk delays only the next write, not the workers'
  // reports or the clients' calls.
  const absl::Status saved = SaveStateLocked(state);
  if (saved.ok()) persisted_changes_ = changes;
  return saved;
}

absl::Status JobManager::SaveState(const v1::CoordinatorState& state) {
  if (options_.state_file == nullptr) return absl::OkStatus();
  MutexLock persist(persist_mu_);
  return SaveStateLocked(state);
}

absl::Status JobManager::SaveStateLocked(const v1::CoordinatorState& state) {
  const absl::Status saved = options_.state_file->Save(state);
  MutexLock health(health_mu_);
  // Logged once per outage: the first failure and the recovery.
  if (!saved.ok() && state_file_error_.empty()) {
    SPDLOG_ERROR(
        "cannot write the state file (submissions and cancels are refused "
        "until it can be written; retrying): {}",
        saved.ToString());
  } else if (saved.ok() && !state_file_error_.empty()) {
    SPDLOG_INFO("state file {} written again", options_.state_file->path());
  }
  state_file_error_ = saved.ok() ? "" : std::string(saved.message());
  return saved;
}

bool JobManager::PersistedThrough(uint64_t change) {
  if (options_.state_file == nullptr) return true;
  MutexLock persist(persist_mu_);
  return persisted_changes_ >= change;
}

std::string JobManager::StateFileError() const {
  MutexLock health(health_mu_);
  return state_file_error_;
}

v1::CoordinatorState JobManager::Snapshot() const {
  v1::CoordinatorState state;
  state.set_version(options_.version);
  state.set_next_job(next_job_);
  for (const auto& [number, job] : jobs_) {
    v1::JobRecordState* saved = state.add_jobs();
    *saved->mutable_info() = job.info;
    v1::SubmitJobRequest* request = saved->mutable_request();
    request->set_yaml(job.parsed.yaml);
    request->set_file_name(job.parsed.file_name);
    request->set_base_dir(job.parsed.base_dir);
    saved->set_config_hash(job.parsed.config_hash);
    if (job.resume.has_value())
      *saved->mutable_resume() = checkpoint::ToProto(*job.resume);
    if (job.committed.has_value()) {
      *saved->mutable_committed() = checkpoint::ToProto(*job.committed);
    }
    saved->set_attempt(job.attempt);
    saved->set_relayout_ranks(job.relayout_ranks);
  }
  for (uint64_t number : queue_.order()) state.add_queue(number);
  return state;
}

absl::Status JobManager::Replan(JobRecord& job) {
  // The plan's copy: a relayout and a checkpoint's cut change it, never the
  // parsed file.
  absl::StatusOr<job::JobSpec> spec = job.parsed.spec;
  if (job.file_ranks == 0) {
    ASSIGN_OR_RETURN(const JobPlan file_plan, PlanJob(*spec));
    job.file_ranks = file_plan.num_ranks;
  }
  if (job.relayout_ranks > 0) {
    ASSIGN_OR_RETURN(spec,
                     job::RelayoutOnto(*std::move(spec), job.relayout_ranks));
  }
  if (job.resume.has_value()) {
    RETURN_IF_ERROR(checkpoint::AdoptCheckpointCut(*job.resume, *spec));
  }
  ASSIGN_OR_RETURN(JobPlan plan, PlanJob(*std::move(spec)));
  if (job.resume.has_value()) {
    RETURN_IF_ERROR(checkpoint::CheckResumeFitsPlan(*job.resume, plan));
  }
  job.plan = std::move(plan);
  DescribePlan(job);
  return absl::OkStatus();
}

absl::Status JobManager::Restore(const v1::CoordinatorState& state) {
  MutexLock lock(mu_);
  if (!jobs_.empty() || !workers_.empty()) {
    return absl::FailedPreconditionError(
        "job records can only be restored before any job or worker");
  }
  // Why a job's saved file no longer parses, by job number.
  std::map<uint64_t, absl::Status> unparsed;
  // First every record, so that a bad file changes nothing.
  for (const v1::JobRecordState& saved : state.jobs()) {
    const uint64_t number = JobNumber(saved.info().id());
    if (number == 0 || number >= (uint64_t{1} << 47) ||
        jobs_.contains(number)) {
      jobs_.clear();
      return absl::DataLossError(absl::StrCat(
          "state file: job id '", saved.info().id(),
          number == 0 ? "' is not job-<n>" : "' is out of range or repeated"));
    }
    JobRecord& job = AddJobRecord(number);
    job.number = number;
    job.info = saved.info();
    job.parsed.yaml = saved.request().yaml();
    job.parsed.file_name = saved.request().file_name();
    job.parsed.base_dir = saved.request().base_dir();
    job.parsed.config_hash = saved.config_hash();
    if (!proto::IsTerminal(job.info.state())) {
      // Parsed once, here: Replan plans from it, and a manifest records its
      // hashes. One the build no longer parses fails below, naming why.
      absl::StatusOr<job::ParsedJob> parsed = job::ParseJob(
          job.parsed.yaml, job.parsed.file_name, job.parsed.base_dir);
      if (parsed.ok()) {
        job.parsed = *std::move(parsed);
      } else {
        unparsed[number] = parsed.status();
      }
    }
    job.attempt = saved.attempt();
    job.relayout_ranks = saved.relayout_ranks();
    if (saved.has_resume()) job.resume = checkpoint::FromProto(saved.resume());
    if (saved.has_committed())
      job.committed = checkpoint::FromProto(saved.committed());
    job.secret = MakeSecret();
    // No worker of this coordinator has heard of the job.
    const int ranks = job.info.worker_ids_size();
    job.ranks.StartEnded(ranks);
    job.programs_sent = true;
    job.info.set_queue_position(0);
  }
  next_job_ =
      std::max<uint64_t>({next_job_, state.next_job(),
                          jobs_.empty() ? 1 : jobs_.rbegin()->first + 1});

  std::vector<uint64_t> ended;        // In the order they ended.
  std::vector<uint64_t> interrupted;  // Placed when the coordinator stopped.
  std::vector<uint64_t> queued;
  for (uint64_t number : state.queue()) {
    auto it = jobs_.find(number);
    if (it != jobs_.end() && it->second.info.state() == v1::QUEUED &&
        std::find(queued.begin(), queued.end(), number) == queued.end()) {
      queued.push_back(number);
    }
  }
  for (auto& [number, job] : jobs_) {
    const v1::JobState s = job.info.state();
    if (proto::IsTerminal(s)) {
      ended.push_back(number);
    } else if (s != v1::QUEUED) {
      interrupted.push_back(number);
    } else if (std::find(queued.begin(), queued.end(), number) ==
               queued.end()) {
      queued.push_back(number);  // Cannot happen with a file we wrote.
    }
  }
  auto ended_before = [&](uint64_t a,
                          uint64_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return jobs_.at(a).info.ended_unix_ms() < jobs_.at(b).info.ended_unix_ms();
  };
  std::stable_sort(ended.begin(), ended.end(), ended_before);
  for (uint64_t number : ended) {
    JobRecord& job = jobs_.at(number);
    job.parsed.yaml.clear();
    AddEvent(job, nullptr);
    finished_jobs_.push_back(number);
  }
  // Each kept job's next event: the job as it is now.
  auto start = [&](JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    AddEvent(job, nullptr);
    if (options_.observer != nullptr) options_.observer->OnSubmitted(job.info);
  };
  std::vector<uint64_t> restarted;
  for (uint64_t number : interrupted) {
    JobRecord& job = jobs_.at(number);
    // The manifest is written before the record of it: a step committed
    // just before the coordinator went down may be newer on disk than in
    // the state file. The directory is the job's alone (and the step of its
    // configuration), so its newest complete step is the job's.
    if (!job.info.checkpoint_dir().empty() && !unparsed.contains(number)) {
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
    start(job);
    if (job.committed.has_value() &&
        job.committed->step >= job.info.steps_total()) {
      Finish(job, v1::SUCCEEDED, "");  // Its final step is committed.
      continue;
    }
    if (job.info.restarts() >= job.info.max_restarts()) {
      Finish(job, v1::FAILED,
             job.committed.has_value()
                 ? absl::StrCat(at, "; step ", job.committed->step,
                                " is its newest complete checkpoint: submit "
                                "it again with `resume: latest` to continue")
                 : absl::StrCat(at, "; it had committed no checkpoint"));
      continue;
    }
    PrepareNextAttempt(job, at);
    if (absl::Status s =
            unparsed.contains(number) ? unparsed.at(number) : Replan(job);
        !s.ok()) {
      Finish(job, v1::FAILED,
             absl::StrCat(at, "; planning it again failed: ", s.message()));
      continue;
    }
    restarted.push_back(number);
    if (options_.observer != nullptr) {
      options_.observer->OnRestarted(job.info, "coordinator_restarted",
                                     /*layout_changed=*/false);
    }
  }
  for (uint64_t number : queued) {
    JobRecord& job = jobs_.at(number);
    start(job);
    if (absl::Status s =
            unparsed.contains(number) ? unparsed.at(number) : Replan(job);
        !s.ok()) {
      Finish(job, v1::FAILED,
             absl::StrCat("the coordinator restarted and planning the job "
                          "again failed: ",
                          s.message()));
      continue;
    }
    queue_.Add(number);
  }
  // Restarted jobs first, as a restart after a lost worker would be.
  for (auto it = restarted.rbegin(); it != restarted.rend(); ++it) {
    queue_.AddFirst(*it);
  }
  for (uint64_t number : restarted) SetState(jobs_.at(number), v1::QUEUED);
  UpdateQueuePositions();
  SPDLOG_INFO(
      "restored {} job record(s): {} ended, {} queued, {} restarted after "
      "the coordinator's restart",
      jobs_.size(), ended.size(),
      queue_.size() - static_cast<int>(restarted.size()), restarted.size());
  // The outcomes decided here (FAILED, restarted) are records too.
  MarkChanged();
  return absl::OkStatus();
}

}  // namespace conveyor::coordinator
