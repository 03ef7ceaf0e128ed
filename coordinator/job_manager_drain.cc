// JobManager, continued: draining a worker (coordinator/job_manager.h
// DrainWorker; the ranks' side is worker/drain_gate.h). One class, one
// mutex; its files by concern.
//
// A drain of a running job takes two messages to every rank: DrainJob asks
// for its DrainPoint (the end of the step it is in; it then holds at each
// step boundary), and DrainJob with the largest point, D, tells every rank
// to checkpoint D and stop there. The ranks report D's files as for any
// checkpoint and end with JobEnded{drained_after_step: D}; once all have,
// D is committed and the job is queued again to resume from it, so no
// completed step is lost or run twice.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/job_manager.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

absl::StatusOr<v1::Worker> JobManager::DrainWorker(const std::string& worker,
                                                   const std::string& reason) {
  v1::Worker out;
  {
    MutexLock lock(mu_);
    WorkerRecord* found = workers_.Find(worker);
    if (found == nullptr || found->info.state() == v1::LOST) {
      found = nullptr;
      for (const WorkerRecord* w : workers_.All()) {
        if (w->info.state() != v1::LOST && w->info.name() == worker) {
          found = workers_.Find(w->info.id());
        }
      }
    }
    if (found == nullptr) {
      std::vector<std::string> live;
      for (const WorkerRecord* w : workers_.All()) {
        if (w->info.state() != v1::LOST) {
          live.push_back(absl::StrCat(w->info.id(), " (", w->info.name(), ")"));
        }
      }
      return absl::NotFoundError(
          absl::StrCat("no live worker '", worker, "'; live workers: ",
                       live.empty() ? "none" : absl::StrJoin(live, ", ")));
    }
    StartDrain(*found,
               reason.empty() ? "drained by conveyorctl drain" : reason);
    out = found->info;
    Schedule();
  }
  (void)Persist();
  return out;
}

void JobManager::StartDrain(WorkerRecord& w, const std::string& reason) {
  if (w.info.draining()) return;
  w.info.set_draining(true);
  w.info.set_drain_reason(reason);
  JobRecord* job =
      w.info.state() == v1::BUSY ? FindJob(w.info.job_id()) : nullptr;
  SPDLOG_INFO("draining {}: {}", DescribeWorker(w), reason);
  if (job == nullptr || proto::IsTerminal(job->info.state())) {
    LeaveIfDrained(w);
    return;
  }
  const auto& ids = job->info.worker_ids();
  if (std::find(ids.begin(), ids.end(), w.info.id()) == ids.end()) {
    return;  // An earlier attempt's worker, still winding down.
  }
  const std::string why =
      absl::StrCat(w.info.id(), " (", w.info.name(), ") is drained: ", reason);
  if (job->info.state() == v1::PLANNING) {
    // Not a step run yet on this attempt: nothing to checkpoint.
    Requeue(*job, why, "drained", /*drained=*/true);
    return;
  }
  if (job->plan.job.checkpoint.dir.empty()) {
    // Nothing to resume from elsewhere: the job ends here first.
    SPDLOG_WARN(
        "{}: has no checkpoint.dir, so it runs to its end on {} "
        "before that worker leaves",
        job->info.id(), w.info.id());
    return;
  }
  if (job->info.state() == v1::RUNNING && !job->failing && !job->draining) {
    DrainJob(*job, why);
  }
}

void JobManager::DrainJob(JobRecord& job, const std::string& reason) {
  job.draining = true;
  job.drain_reason = reason;
  job.drain_points.clear();
  job.drain_step = 0;
  // As long as a rank may take to answer a message; a rank that does not
  // answer fails the job as a silent one would.
  job.drain_deadline = options_.clock() + options_.heartbeat_timeout;
  v1::CoordinatorMessage m;
  m.mutable_drain()->set_job_id(job.info.id());
  SendToRunningRanks(job, m);
  SPDLOG_INFO(
      "{}: draining ({}): asking every rank for its next step "
      "boundary",
      job.info.id(), reason);
  MaybeSendDrainStep(job);
}

void JobManager::OnDrainPoint(WorkerRecord& w, const v1::DrainPoint& point) {
  JobRecord* job = FindJob(point.job_id());
  if (job == nullptr || !job->draining || job->drain_step > 0 ||
      w.info.job_id() != point.job_id()) {
    return;  // Late: the job ended or restarted meanwhile.
  }
  const auto& ids = job->info.worker_ids();
  const int rank = static_cast<int>(
      std::find(ids.begin(), ids.end(), w.info.id()) - ids.begin());
  if (rank >= ids.size()) return;
  job->drain_points[rank] = point.step();
  MaybeSendDrainStep(*job);
}

void JobManager::MaybeSendDrainStep(JobRecord& job) {
  if (!job.draining || job.drain_step > 0) return;
  const int p = job.info.worker_ids_size();
  int64_t step = 0;
  for (int r = 0; r < p; ++r) {
    auto it = job.drain_points.find(r);
    if (it != job.drain_points.end()) {
      step = std::max(step, it->second);
    } else if (job.ranks.ended(r)) {
      // It ran to the end (a failure would have made the job `failing`).
      step = std::max(step, job.info.steps_total());
    } else {
      return;
    }
  }
  // Past the last step the job simply ends, and the worker leaves then.
  job.drain_step = std::clamp<int64_t>(step, 1, job.info.steps_total());
  SPDLOG_INFO("{}: every rank stops after step {}", job.info.id(),
              job.drain_step);
  v1::CoordinatorMessage m;
  m.mutable_drain()->set_job_id(job.info.id());
  m.mutable_drain()->set_stop_after_step(job.drain_step);
  SendToRunningRanks(job, m);
}

void JobManager::FinishDrain(JobRecord& job) {
  const int64_t step = job.drain_step;
  if (!job.committed.has_value() || job.committed->step < step) {
    // A report went missing: the newest complete step is older.
    FailOrRestart(job,
                  absl::StrCat("drain: the checkpoint of step ", step,
                               " is incomplete (", job.drain_reason, ")"),
                  "drained");
    return;
  }
  SPDLOG_INFO("{}: drained after step {}; queued to resume there",
              job.info.id(), step);
  Requeue(job, job.drain_reason, "drained", /*drained=*/true);
}

void JobManager::LeaveIfDrained(WorkerRecord& w) {
  if (!w.info.draining() || w.left || w.info.state() != v1::IDLE) return;
  w.left = true;
  v1::CoordinatorMessage m;
  m.mutable_leave()->set_reason(w.info.drain_reason());
  w.connection->Send(m);
  SPDLOG_INFO("{} drained: told to leave", w.info.id());
}

}  // namespace conveyor::coordinator
