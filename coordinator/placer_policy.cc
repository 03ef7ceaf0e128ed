// Placer (coordinator/placer.h), continued: its scheduling policy: owner
// quotas, preemption of lower-priority jobs by drain, and why each queued
// job waits. The pure parts (parsing quotas, choosing victims) are
// coordinator/scheduling_policy.h.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/ids.h"
#include "coordinator/placer.h"
#include "coordinator/scheduling_policy.h"
#include "job/job_policy.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

namespace {

bool IsPlaced(const v1::Job& job) {
  return job.state() == v1::PLANNING || job.state() == v1::RUNNING;
}

// "job-12 (high)".
std::string Named(const v1::Job& job) {
  return absl::StrCat(job.id(), " (", job::PriorityName(job.priority()), ")");
}

std::string Workers(int n) {
  return absl::StrCat(n, n == 1 ? " worker" : " workers");
}

}  // namespace

std::map<std::string, int> Placer::HeldByOwner() const {
  std::map<std::string, int> held;
  for (const auto& [number, run] : jobs_) {
    const v1::Job& info = run.job().info;
    if (!info.owner().empty() && IsPlaced(info)) {
      held[info.owner()] += info.worker_ids_size();
    }
  }
  return held;
}

std::optional<int> Placer::OverQuota(
    const JobRun& run, const std::map<std::string, int>& held) const {
  const std::string& owner = run.job().info.owner();
  if (owner.empty()) return std::nullopt;
  const OwnerQuotas& quotas = ctx_.options().owner_quotas;
  const auto quota = quotas.find(owner);
  if (quota == quotas.end()) return std::nullopt;
  const auto h = held.find(owner);
  const int used = h == held.end() ? 0 : h->second;
  if (used + run.job().plan.num_ranks <= quota->second) return std::nullopt;
  return quota->second;
}

int Placer::WorkersComing(int64_t devices) {
  int coming = 0;
  for (const WorkerRecord* w : ctx_.workers().All()) {
    if (w->info.state() != v1::BUSY || w->info.draining() ||
        w->info.devices_size() < devices) {
      continue;
    }
    const auto it = jobs_.find(JobNumber(w->info.job_id()));
    if (it == jobs_.end()) {
      ++coming;
      continue;
    }
    const JobRun::JobRecord& job = it->second.job();
    const auto& ids = job.info.worker_ids();
    const bool in_attempt =
        std::find(ids.begin(), ids.end(), w->info.id()) != ids.end();
    if (!IsPlaced(job.info) || !in_attempt || job.preempting) ++coming;
  }
  return coming;
}

void Placer::Preempt(JobRun& blocked) {
  const JobRun::JobRecord& urgent = blocked.job();
  const int64_t devices = urgent.plan.job.pipeline.devices_per_stage;
  const int needed = urgent.plan.num_ranks;
  // Jobs that wait for workers that are not there at all wait for them to
  // register; draining others would not help.
  if (ctx_.workers().Live(devices) < needed) return;
  const int free = static_cast<int>(ctx_.workers().Idle(devices).size()) +
                   WorkersComing(devices);
  if (free >= needed) return;  // Enough are on their way.
  std::vector<PreemptionCandidate> candidates;
  for (auto& [number, run] : jobs_) {
    const JobRun::JobRecord& job = run.job();
    if (!IsPlaced(job.info) || job.preempting || job.draining || job.failing ||
        job.info.priority() >= urgent.info.priority()) {
      continue;
    }
    // A running job needs a checkpoint to resume from with nothing
    // redone; one still planning has run no step of this attempt.
    if (job.info.state() == v1::RUNNING &&
        job.plan.job.checkpoint.dir.empty()) {
      continue;
    }
    int workers = 0;
    for (const std::string& id : job.info.worker_ids()) {
      const WorkerRecord* w = ctx_.workers().Find(id);
      if (w != nullptr && w->info.state() == v1::BUSY && !w->info.draining() &&
          w->info.devices_size() >= devices) {
        ++workers;
      }
    }
    candidates.push_back({.number = number,
                          .priority = job.info.priority(),
                          .workers = workers});
  }
  const std::optional<std::vector<uint64_t>> victims =
      ChooseVictims(std::move(candidates), needed - free);
  if (!victims.has_value()) return;
  for (const uint64_t number : *victims) {
    JobRun& run = jobs_.at(number);
    JobRun::JobRecord& job = run.job();
    const std::string why =
        absl::StrCat("preempted by ", Named(urgent.info), ", which needs ",
                     Workers(needed), " (", free, " free)");
    SPDLOG_INFO("{}: {}", Named(job.info), why);
    job.preempting = true;
    job.info.set_preemptions(job.info.preemptions() + 1);
    job.info.set_preempted_by(urgent.info.id());
    ctx_.MarkJobChanged(number);
    if (job.info.state() == v1::PLANNING) {
      // No step of this attempt has run: requeued at once, its workers
      // told to stop.
      run.Requeue(why, "preempted", /*drained=*/true);
    } else {
      run.DrainJob(why);
    }
  }
}

std::string Placer::WhyQueued(const JobRun& run, int live, int idle,
                              const JobRun* blocked,
                              const std::map<std::string, int>& held) {
  const JobRun::JobRecord& job = run.job();
  // A job that waits for workers that are not there says so, whatever its
  // turn: a queue that never moves must not look like one that will.
  const int64_t devices = job.plan.job.pipeline.devices_per_stage;
  const int needed = job.plan.num_ranks;
  const std::string workers = absl::StrCat(
      Workers(needed),
      devices > 1 ? absl::StrCat(" with ", devices, " devices") : "");
  if (live < needed) {
    return absl::StrCat("needs ", workers, "; ", live,
                        live == 1 ? " is" : " are",
                        " live: it waits for more to register");
  }
  if (const std::optional<int> quota = OverQuota(run, held)) {
    const std::string& owner = job.info.owner();
    if (needed > *quota) {
      return absl::StrCat("needs ", workers, ", more than owner ", owner,
                          "'s quota of ", *quota,
                          ": it cannot run until the quota is raised");
    }
    const auto h = held.find(owner);
    return absl::StrCat("owner ", owner, " at quota ", *quota,
                        " (its jobs hold ", h == held.end() ? 0 : h->second,
                        "; this one needs ", needed, ")");
  }
  const std::string free = absl::StrCat("needs ", workers, ", ", idle, " free");
  if (blocked != nullptr) {
    return absl::StrCat(free, "; behind ", Named(blocked->job().info));
  }
  if (idle >= needed) return "";  // Placed at the next pass.
  // The first in line: what frees workers for it.
  std::vector<std::string> preempted;
  for (const auto& [number, other] : jobs_) {
    const JobRun::JobRecord& o = other.job();
    if (o.preempting && o.info.preempted_by() == job.info.id() &&
        IsPlaced(o.info)) {
      preempted.push_back(Named(o.info));
    }
  }
  if (!preempted.empty()) {
    return absl::StrCat(free, "; preempting ", absl::StrJoin(preempted, ", "),
                        ", draining at the next step boundary");
  }
  if (const int coming = WorkersComing(devices); coming > 0) {
    return absl::StrCat(free, "; ", coming, " more finishing");
  }
  if (!ctx_.options().preemption) {
    return absl::StrCat(free, "; the others run other jobs (preemption off)");
  }
  return absl::StrCat(free,
                      "; the others run jobs it cannot preempt (of equal or "
                      "higher priority, or without checkpoint.dir)");
}

}  // namespace conveyor::coordinator
