// JobRun (coordinator/job_run.h), continued: the drain of the job's
// attempt (JobManager::DrainWorker; the ranks' side is worker/drain_gate.h).
//
// A drain of a running job takes two messages to every rank: DrainJob asks
// for its DrainPoint (the end of the step it is in; it then holds at each
// step boundary), and DrainJob with the largest point, D, tells every rank
// to checkpoint D and stop there. The ranks report D's files as for any
// checkpoint and end with JobEnded{drained_after_step: D}; once all have,
// D is committed and the job is queued again to resume from it, so no
// completed step is lost or run twice. A preemption (coordinator/placer.h
// Preempt) is the same drain, started by the Placer for a job of higher
// priority rather than by a worker's drain.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/job_run.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

void JobRun::DrainJob(const std::string& reason) {
  job_.draining = true;
  job_.drain_reason = reason;
  job_.drain_points.clear();
  job_.drain_step = 0;
  // As long as a rank may take to answer a message; a rank that does not
  // answer fails the job as a silent one would.
  job_.drain_deadline =
      ctx_.options().clock() + ctx_.options().heartbeat_timeout;
  v1::CoordinatorMessage m;
  m.mutable_drain()->set_job_id(job_.info.id());
  SendToRunningRanks(m);
  SPDLOG_INFO(
      "{}: draining ({}): asking every rank for its next step "
      "boundary",
      job_.info.id(), reason);
  MaybeSendDrainStep();
}

void JobRun::OnDrainPoint(WorkerRecord& w, const v1::DrainPoint& point) {
  if (!job_.draining || job_.drain_step > 0 ||
      w.info.job_id() != point.job_id()) {
    return;  // Late: the job ended or restarted meanwhile.
  }
  const int rank = RankOf(w);
  if (rank >= job_.info.worker_ids_size()) return;
  job_.drain_points[rank] = point.step();
  MaybeSendDrainStep();
}

void JobRun::MaybeSendDrainStep() {
  if (!job_.draining || job_.drain_step > 0) return;
  const int p = job_.info.worker_ids_size();
  int64_t step = 0;
  for (int r = 0; r < p; ++r) {
    auto it = job_.drain_points.find(r);
    if (it != job_.drain_points.end()) {
      step = std::max(step, it->second);
    } else if (job_.ranks.ended(r)) {
      // It ran to the end (a failure would have made the job `failing`).
      step = std::max(step, job_.info.steps_total());
    } else {
      return;
    }
  }
  // Past the last step the job simply ends, and the worker leaves then.
  job_.drain_step = std::clamp<int64_t>(step, 1, job_.info.steps_total());
  SPDLOG_INFO("{}: every rank stops after step {}", job_.info.id(),
              job_.drain_step);
  v1::CoordinatorMessage m;
  m.mutable_drain()->set_job_id(job_.info.id());
  m.mutable_drain()->set_stop_after_step(job_.drain_step);
  SendToRunningRanks(m);
}

void JobRun::FinishDrain() {
  SettleCommits();
  if (proto::IsTerminal(job_.info.state())) return;
  const int64_t step = job_.drain_step;
  if (!job_.committed.has_value() || job_.committed->step < step) {
    // A report went missing: the newest complete step is older.
    FailOrRestart(absl::StrCat("drain: the checkpoint of step ", step,
                               " is incomplete (", job_.drain_reason, ")"),
                  "drained");
    return;
  }
  SPDLOG_INFO("{}: drained after step {}; queued to resume there",
              job_.info.id(), step);
  Requeue(job_.drain_reason, job_.preempting ? "preempted" : "drained",
          /*drained=*/true);
}

}  // namespace conveyor::coordinator
