#include "coordinator/job_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/resume.h"
#include "coordinator/ids.h"
#include "job/parsed_job.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

namespace {

void AddRecord(const JobRun& run, v1::CoordinatorState& state) {
  const JobRun::JobRecord& job = run.job();
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

}  // namespace

v1::CoordinatorState JobStore::Snapshot(const std::string& version,
                                        uint64_t next_job,
                                        const std::map<uint64_t, JobRun>& jobs,
                                        const JobQueue& queue) {
  v1::CoordinatorState state;
  state.set_version(version);
  state.set_next_job(next_job);
  for (const auto& [number, run] : jobs) AddRecord(run, state);
  for (uint64_t number : queue.order()) state.add_queue(number);
  return state;
}

v1::CoordinatorState JobStore::Changes(const std::string& version,
                                       uint64_t next_job,
                                       const std::map<uint64_t, JobRun>& jobs,
                                       const JobQueue& queue,
                                       const std::set<uint64_t>& changed,
                                       std::vector<uint64_t>* removed) {
  v1::CoordinatorState state;
  state.set_version(version);
  state.set_next_job(next_job);
  for (uint64_t number : changed) {
    auto it = jobs.find(number);
    if (it != jobs.end()) {
      AddRecord(it->second, state);
    } else {
      removed->push_back(number);
    }
  }
  for (uint64_t number : queue.order()) state.add_queue(number);
  return state;
}

absl::StatusOr<JobStore::Restored> JobStore::Restore(
    const v1::CoordinatorState& state, JobRunContext& context,
    std::map<uint64_t, JobRun>& jobs) {
  Restored out;
  // First every record, so that a bad file changes nothing.
  for (const v1::JobRecordState& saved : state.jobs()) {
    const uint64_t number = JobNumber(saved.info().id());
    if (number == 0 || number >= (uint64_t{1} << 47) || jobs.contains(number)) {
      jobs.clear();
      return absl::DataLossError(absl::StrCat(
          "state file: job id '", saved.info().id(),
          number == 0 ? "' is not job-<n>" : "' is out of range or repeated"));
    }
    JobRun::JobRecord& job =
        jobs.try_emplace(number, context, number).first->second.job();
    job.info = saved.info();
    job.parsed.yaml = saved.request().yaml();
    job.parsed.file_name = saved.request().file_name();
    job.parsed.base_dir = saved.request().base_dir();
    job.parsed.config_hash = saved.config_hash();
    if (!proto::IsTerminal(job.info.state())) {
      // Parsed once, here: Replan plans from it, and a manifest records its
      // hashes. One the build no longer parses fails later, naming why.
      absl::StatusOr<job::ParsedJob> parsed = job::ParseJob(
          job.parsed.yaml, job.parsed.file_name, job.parsed.base_dir);
      if (parsed.ok()) {
        job.parsed = *std::move(parsed);
      } else {
        out.unparsed[number] = parsed.status();
      }
    }
    job.attempt = saved.attempt();
    job.relayout_ranks = saved.relayout_ranks();
    if (saved.has_resume()) job.resume = checkpoint::FromProto(saved.resume());
    if (saved.has_committed())
      job.committed = checkpoint::FromProto(saved.committed());
    job.secret = JobRun::MakeSecret();
    // No worker of this coordinator has heard of the job.
    const int ranks = job.info.worker_ids_size();
    job.ranks.StartEnded(ranks);
    job.programs_sent = true;
    job.info.set_queue_position(0);
  }
  out.next_job = std::max<uint64_t>(
      {state.next_job(), jobs.empty() ? 1 : jobs.rbegin()->first + 1});

  for (uint64_t number : state.queue()) {
    auto it = jobs.find(number);
    if (it != jobs.end() && it->second.job().info.state() == v1::QUEUED &&
        std::find(out.queued.begin(), out.queued.end(), number) ==
            out.queued.end()) {
      out.queued.push_back(number);
    }
  }
  for (auto& [number, run] : jobs) {
    const v1::JobState s = run.job().info.state();
    if (proto::IsTerminal(s)) {
      out.ended.push_back(number);
    } else if (s != v1::QUEUED) {
      out.interrupted.push_back(number);
    } else if (std::find(out.queued.begin(), out.queued.end(), number) ==
               out.queued.end()) {
      out.queued.push_back(number);  // Cannot happen with a file we wrote.
    }
  }
  std::stable_sort(out.ended.begin(), out.ended.end(),
                   [&](uint64_t a, uint64_t b) {
                     return jobs.at(a).job().info.ended_unix_ms() <
                            jobs.at(b).job().info.ended_unix_ms();
                   });
  for (uint64_t number : out.ended) jobs.at(number).job().parsed.yaml.clear();
  return out;
}

absl::Status JobStore::Persist(
    absl::FunctionRef<std::optional<Snapshotted>(uint64_t persisted, bool full)>
        take) {
  if (file_ == nullptr) return absl::OkStatus();
  MutexLock persist(persist_mu_);
  std::optional<Snapshotted> snapshot = take(persisted_changes_, want_full_);
  if (!snapshot.has_value()) return absl::OkStatus();
  // Outside the manager's lock: a slow disk delays only the next write, not
  // the workers' reports or the clients' calls.
  const absl::Status saved = Written(
      snapshot->full ? file_->Save(snapshot->state)
                     : file_->Append(snapshot->state, snapshot->removed),
      snapshot->full);
  if (saved.ok()) persisted_changes_ = snapshot->change;
  return saved;
}

absl::Status JobStore::Save(const v1::CoordinatorState& state) {
  if (file_ == nullptr) return absl::OkStatus();
  MutexLock persist(persist_mu_);
  return Written(file_->Save(state), /*full=*/true);
}

absl::Status JobStore::SaveAhead(const v1::CoordinatorState& changed) {
  if (file_ == nullptr) return absl::OkStatus();
  MutexLock persist(persist_mu_);
  return Written(file_->Append(changed, {}), /*full=*/false);
}

absl::Status JobStore::Written(absl::Status saved, bool full) {
  // Only a full write clears it: a delta written after a failed one would
  // not hold the failed one's changes.
  if (!saved.ok()) {
    want_full_ = true;
  } else if (full) {
    want_full_ = false;
  }
  MutexLock health(health_mu_);
  // Logged once per outage: the first failure and the recovery.
  if (!saved.ok() && state_file_error_.empty()) {
    SPDLOG_ERROR(
        "cannot write the state file (submissions and cancels are refused "
        "until it can be written; retrying): {}",
        saved.ToString());
  } else if (saved.ok() && !state_file_error_.empty()) {
    SPDLOG_INFO("state file {} written again", file_->path());
  }
  state_file_error_ = saved.ok() ? "" : std::string(saved.message());
  return saved;
}

bool JobStore::PersistedThrough(uint64_t change) {
  if (file_ == nullptr) return true;
  MutexLock persist(persist_mu_);
  return persisted_changes_ >= change;
}

std::string JobStore::StateFileError() const {
  MutexLock health(health_mu_);
  return state_file_error_;
}

}  // namespace conveyor::coordinator
