// JobManager, continued: the reports of a placed job and its states to the end
// (coordinator/job_manager.h). One class, one mutex; its files by concern.
#include <algorithm>
#include <cmath>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/directory.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "coordinator/data_plane_choice.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_states.h"
#include "coordinator/metrics_log.h"
#include "job/job_spec.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

using job::StagePlan;

void JobManager::OnReady(WorkerRecord& w, const v1::JobReady& ready) {
  JobRecord* job = FindJob(ready.job_id());
  if (job == nullptr || job->info.state() != v1::PLANNING ||
      w.info.job_id() != ready.job_id()) {
    return;  // Late: the job ended meanwhile.
  }
  const auto& ids = job->info.worker_ids();
  const int rank = static_cast<int>(
      std::find(ids.begin(), ids.end(), w.info.id()) - ids.begin());
  if (rank >= ids.size() || job->ranks.is_ready(rank)) return;
  if (ready.data_endpoint().empty()) {
    Finish(*job, v1::FAILED,
           absl::StrCat(DescribeWorker(w), " reported no data endpoint"));
    return;
  }
  job->ranks.MarkReady(rank, ready);
  w.info.set_data_endpoint(ready.data_endpoint());
  if (!job->ranks.all_ready()) return;
  const DataPlaneChoice plane = ChooseDataPlane(job->ranks.ready_reports());
  // The MFU's denominator: each rank's devices at the job's precision. One
  // rank of unknown peak leaves the job without MFU rather than a wrong one.
  job->rates.peak_flops = 0;
  for (const v1::JobReady& r : job->ranks.ready_reports()) {
    if (!(r.peak_flops() > 0) || !std::isfinite(r.peak_flops())) {
      job->rates.peak_flops = 0;
      break;
    }
    job->rates.peak_flops += r.peak_flops();
  }
  job->info.set_data_plane(plane.description);
  SPDLOG_INFO("{}: tensors over {}", job->info.id(), plane.description);
  v1::CoordinatorMessage m;
  m.mutable_start()->set_job_id(job->info.id());
  m.mutable_start()->set_nccl(plane.nccl);
  for (const std::string& e : job->ranks.endpoints()) {
    m.mutable_start()->add_peers(e);
  }
  for (const std::string& id : ids) {
    const WorkerRecord* peer = workers_.Find(id);
    m.mutable_start()->add_peer_names(peer != nullptr ? peer->info.name() : id);
  }
  job->info.set_started_unix_ms(NowUnixMs());
  SetState(*job, v1::RUNNING);
  for (const std::string& id : ids) {
    WorkerRecord* peer = workers_.Find(id);
    if (peer != nullptr) peer->connection->Send(m);
  }
}

void JobManager::OnStep(WorkerRecord& w, const v1::StepReport& report) {
  JobRecord* job = FindJob(report.job_id());
  if (job == nullptr || job->info.state() != v1::RUNNING ||
      w.info.job_id() != report.job_id()) {
    return;
  }
  const auto& ids = job->info.worker_ids();
  const int rank = static_cast<int>(
      std::find(ids.begin(), ids.end(), w.info.id()) - ids.begin());
  const int p = job->plan.num_ranks;
  if (rank >= p || report.step() < 1 ||
      report.step() > job->info.steps_total()) {
    return;
  }
  std::optional<v1::StepSummary> summary =
      job->steps.Add(rank, p, report, job->rates);
  if (!summary.has_value()) return;
  const v1::StepSummary& s = *summary;
  v1::Job& info = job->info;
  info.set_steps_done(std::max(info.steps_done(), s.step()));
  job->stepped = true;
  job->attempts_lost_before_a_step = 0;
  if (s.has_loss()) {
    info.set_has_loss(true);
    info.set_last_loss(s.loss());
  }
  if (s.has_eval()) {
    info.set_has_eval(true);
    info.set_last_eval_step(s.step());
    info.set_last_eval_loss(s.eval_loss());
    info.set_last_eval_perplexity(s.eval_perplexity());
  }
  info.set_last_step_seconds(s.seconds());
  info.set_last_step_unix_ms(NowUnixMs());
  info.set_last_grad_norm(s.grad_norm());
  info.set_last_mfu(s.mfu());
  info.set_samples_per_second(s.samples_per_second());
  info.set_tokens_per_second(s.tokens_per_second());
  AddEvent(*job, &s);
  if (options_.observer != nullptr) options_.observer->OnStep(info, s);
  if (const std::string& dir = job->plan.job.checkpoint.dir; !dir.empty()) {
    // A job's first step from scratch starts the file over: an earlier run
    // in the directory (`run --overwrite`) is not this job's history.
    const bool start_over =
        s.step() == 1 && !job->resume.has_value() && info.restarts() == 0;
    if (absl::Status logged = AppendMetricsLog(
            dir, MetricsLogLine(s, NowUnixMs(), info.restarts()), start_over);
        !logged.ok() && !job->metrics_log_failed) {
      // Once per job: a full disk must not fill the log too.
      job->metrics_log_failed = true;
      SPDLOG_WARN("{}: no step history: {}", info.id(),
                  std::string(logged.message()));
    }
  }
}

void JobManager::OnEnded(WorkerRecord& w, const v1::JobEnded& ended) {
  if (w.info.job_id() != ended.job_id()) return;  // Stale.
  JobRecord* job = FindJob(ended.job_id());
  // The worker's message already names its rank and stages.
  const std::string who = absl::StrCat(w.info.id(), " (", w.info.name(), ")");
  ReleaseWorker(w);
  if (job == nullptr) return;
  const auto& ids = job->info.worker_ids();
  const int rank = static_cast<int>(
      std::find(ids.begin(), ids.end(), w.info.id()) - ids.begin());
  if (rank >= ids.size()) return;
  job->ranks.MarkEnded(rank);
  if (proto::IsTerminal(job->info.state())) return;
  const bool all_ended = job->ranks.all_ended();
  if (ended.drained_after_step() > 0 && job->draining && !job->failing &&
      ended.drained_after_step() == job->drain_step) {
    if (all_ended) FinishDrain(*job);
    return;
  }
  if (ended.state() == v1::SUCCEEDED) {
    if (all_ended && !job->failing) {
      // Every rank wrote its final files before reporting success, so the
      // last step is committed by now unless a report went missing.
      const int64_t last = job->info.steps_total();
      if (!job->plan.job.checkpoint.dir.empty() &&
          job->info.last_checkpoint_step() != last) {
        Finish(*job, v1::FAILED,
               absl::StrCat("the final checkpoint (step ", last,
                            ") is incomplete: not every stage reported its "
                            "file"));
      } else {
        Finish(*job, v1::SUCCEEDED, "");
      }
    } else if (all_ended) {
      FailOrRestart(*job, job->failure, "rank_failed");
    }
    return;
  }
  if (!job->failing) {
    job->failing = true;
    job->failure = absl::StrCat(who, ": ", ended.message());
    // A worker that could not prepare the job for a reason in the job
    // itself (too large for the machine, a bad file, an invalid setting)
    // would fail the same way on any other: no restart.
    const auto code = static_cast<absl::StatusCode>(ended.code());
    if (job->info.state() == v1::PLANNING &&
        (code == absl::StatusCode::kInvalidArgument ||
         code == absl::StatusCode::kResourceExhausted ||
         code == absl::StatusCode::kFailedPrecondition ||
         code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kPermissionDenied)) {
      job->no_restart =
          "preparing the job failed for a reason of its own, which another "
          "attempt would meet too";
    } else if (job->info.state() == v1::PLANNING &&
               code == absl::StatusCode::kDataLoss) {
      // A damaged checkpoint file: the next attempt would resume from the
      // same step and read the same bytes, so restarts would only be used
      // up one by one before the job fails anyway.
      job->no_restart =
          "the checkpoint it resumes from is damaged, and another attempt "
          "would read the same files; resubmit with resume: set to an "
          "older step directory";
    }
    job->failure_deadline = options_.clock() + options_.failure_grace;
    // Stop the others now; the job's final state waits for the grace.
    v1::CoordinatorMessage m;
    m.mutable_cancel()->set_job_id(job->info.id());
    m.mutable_cancel()->set_reason(job->failure);
    SendToRunningRanks(*job, m);
  }
  // Every worker has answered, so none was lost: no reason to wait.
  if (all_ended) FailOrRestart(*job, job->failure, "rank_failed");
}

void JobManager::OnCheckpoint(WorkerRecord& w,
                              const v1::CheckpointSaved& saved) {
  JobRecord* job = FindJob(saved.job_id());
  if (job == nullptr || job->info.state() != v1::RUNNING ||
      w.info.job_id() != saved.job_id() ||
      job->plan.job.checkpoint.dir.empty()) {
    return;  // Late: the job ended or restarted meanwhile.
  }
  const auto& ids = job->info.worker_ids();
  const int rank = static_cast<int>(
      std::find(ids.begin(), ids.end(), w.info.id()) - ids.begin());
  if (rank >= ids.size()) return;
  absl::StatusOr<std::optional<CheckpointCollector::StepFiles>> complete =
      job->checkpoints.Add(rank, saved.step(), saved.files());
  if (!complete.ok()) {
    FailOrRestart(
        *job, absl::StrCat(DescribeWorker(w), " ", complete.status().message()),
        "bad_report");
    return;
  }
  if (complete->has_value()) CommitCheckpoint(*job, saved.step(), **complete);
}

void JobManager::CommitCheckpoint(JobRecord& job, int64_t step,
                                  const std::map<int, v1::StageFile>& files) {
  const std::string& dir = job.plan.job.checkpoint.dir;
  const checkpoint::CheckpointManifest manifest = checkpoint::MakeManifest(
      job.plan, job.info.id(), job.parsed.config_hash, job.parsed.training_hash,
      job.parsed.yaml, step, files, NowUnixMs());
  if (step == options_.fault_commit_step) {
    SPDLOG_WARN(
        "{}: fault injection: every file of step {} is in; pausing "
        "{} ms before its manifest",
        job.info.id(), step, options_.fault_commit_delay.count());
    std::this_thread::sleep_for(options_.fault_commit_delay);
  }
  // Under the lock: the manifest is small, and no other commit or resume
  // of this job may interleave with it.
  if (absl::Status written = checkpoint::WriteManifest(dir, manifest);
      !written.ok()) {
    Finish(job, v1::FAILED,
           absl::StrCat("committing the checkpoint of step ", step,
                        " failed: ", written.message()));
    return;
  }
  job.committed = checkpoint::ResumePointOf(manifest, dir);
  job.info.set_last_checkpoint_step(step);
  job.info.set_last_checkpoint_unix_ms(NowUnixMs());
  MarkChanged();
  SPDLOG_INFO("{}: checkpoint of step {} complete in {}", job.info.id(), step,
              checkpoint::StepDirPath(dir, step));
  if (const int64_t keep = job.plan.job.checkpoint.keep_latest; keep > 0) {
    absl::StatusOr<std::vector<int64_t>> removed =
        checkpoint::PruneCheckpoints(dir, static_cast<int>(keep));
    if (!removed.ok()) {
      // The new step is committed; an old one left behind costs only disk.
      SPDLOG_WARN("{}: pruning old checkpoints in {}: {}", job.info.id(), dir,
                  std::string(removed.status().message()));
    } else if (!removed->empty()) {
      SPDLOG_INFO("{}: removed checkpoint steps {} (keep_latest {})",
                  job.info.id(), absl::StrJoin(*removed, ", "), keep);
    }
  }
  AddEvent(job, nullptr);
}

void JobManager::FailOrRestart(JobRecord& job, const std::string& reason,
                               absl::string_view kind) {
  if (proto::IsTerminal(job.info.state())) return;
  const bool placed =
      job.info.state() == v1::PLANNING || job.info.state() == v1::RUNNING;
  if (!job.no_restart.empty() && job.info.max_restarts() > 0 &&
      job.info.restarts() < job.info.max_restarts()) {
    Finish(job, v1::FAILED,
           absl::StrCat(reason, " (not restarted: ", job.no_restart, ")"));
    return;
  }
  if (!placed || job.info.restarts() >= job.info.max_restarts()) {
    Finish(job, v1::FAILED,
           job.info.max_restarts() > 0
               ? absl::StrCat(reason, " (after ", job.info.restarts(), " of ",
                              job.info.max_restarts(), " restarts)")
               : reason);
    return;
  }
  // The final step is committed: the job's result is complete and durable,
  // whatever happened to a worker while it reported its end.
  if (job.committed.has_value() &&
      job.committed->step >= job.info.steps_total()) {
    Finish(job, v1::SUCCEEDED, "");
    return;
  }
  Requeue(job, reason, kind, /*drained=*/false);
}

namespace {

// Why a restart cannot go ahead on `live` workers.
std::string TooFewWorkers(const std::string& reason, int ranks, int live,
                          int64_t min_workers) {
  return absl::StrCat(
      reason, "; not restarted: the job needs ", ranks, " workers and ", live,
      " are live",
      min_workers > 0
          ? absl::StrCat(", fewer than restart.elastic.min_workers (",
                         min_workers, ")")
          : "");
}

}  // namespace

void JobManager::Requeue(JobRecord& job, std::string reason,
                         absl::string_view kind, bool drained) {
  // The file's layout when enough workers are live (so an elastic job goes
  // back to it once they are), else, elastic, as many as are.
  const int live = workers_.Live(job.plan.job.pipeline.devices_per_stage);
  const int64_t min_workers = job.plan.job.restart.elastic_min_workers;
  // (file_ranks is set by submission and by Replan; the plan's count is
  // the file's unless the job was laid out anew.)
  int ranks = job.file_ranks > 0 ? job.file_ranks : job.plan.num_ranks;
  if (live < ranks && (min_workers == 0 || live < min_workers) && drained) {
    // Nothing was lost: the job waits at the head of the queue for the
    // workers its layout needs (a replacement for the drained one).
    SPDLOG_WARN("{}: waits for {} workers ({} live)", job.info.id(), ranks,
                live);
  } else if (live < ranks) {
    if (min_workers == 0 || live < min_workers) {
      Finish(job, v1::FAILED, TooFewWorkers(reason, ranks, live, min_workers));
      return;
    }
    ranks = live;
  }
  StopWorkers(job, reason);
  PrepareNextAttempt(job, reason, /*counted=*/!drained);
  const bool layout_changed = ranks != job.plan.num_ranks;
  if (layout_changed && !LayOutOn(job, ranks, reason)) return;
  // Until it is placed, every change of the fleet re-examines it
  // (ReexamineRestarts): a worker this count took for live may be lost
  // next, as when two die at once.
  if (!drained) job.restart_reason = reason;
  // At the head: the job was running, and a restart must not wait behind
  // work submitted after it.
  queue_.AddFirst(job.number);
  UpdateQueuePositions();
  SetState(job, v1::QUEUED);
  if (options_.observer != nullptr) {
    options_.observer->OnRestarted(job.info, kind, layout_changed);
  }
}

bool JobManager::LayOutOn(JobRecord& job, int ranks,
                          const std::string& reason) {
  // A schedule may not plan on every worker count (interleaved-1f1b needs
  // M to be a multiple of P): fewer workers, down to the minimum, before
  // giving up.
  const int64_t min_workers = job.plan.job.restart.elastic_min_workers;
  absl::Status laid_out = absl::UnknownError("no worker count tried");
  const int lowest = ranks < job.file_ranks
                         ? static_cast<int>(std::max<int64_t>(min_workers, 1))
                         : ranks;
  absl::Status first_failure;
  for (int r = ranks; r >= lowest && !laid_out.ok(); --r) {
    laid_out = Relayout(job, r, reason);
    if (r == ranks) first_failure = laid_out;
  }
  if (laid_out.ok()) {
    // Why workers that are live sit idle (interleaved-1f1b on 3 of 3 live
    // workers with 4 microbatches, say): `status` shows it with the layout.
    if (!first_failure.ok()) {
      absl::StrAppend(&job.layout_reason, "; not on ", ranks, ": ",
                      first_failure.message());
    }
    return true;
  }
  Finish(job, v1::FAILED,
         absl::StrCat(reason,
                      "; not restarted: the job cannot be laid "
                      "out on ",
                      lowest == ranks ? absl::StrCat(ranks)
                                      : absl::StrCat(lowest, " to ", ranks),
                      " workers: ", laid_out.message()));
  return false;
}

void JobManager::ReexamineRestarts() {
  // A copy: Finish takes jobs out of the queue.
  const std::vector<uint64_t> queued(queue_.order().begin(),
                                     queue_.order().end());
  for (const uint64_t number : queued) {
    JobRecord& job = jobs_.at(number);
    if (job.info.state() != v1::QUEUED || job.restart_reason.empty()) continue;
    const int live = workers_.Live(job.plan.job.pipeline.devices_per_stage);
    const int ranks = job.plan.num_ranks;
    if (live >= ranks) continue;
    const int64_t min_workers = job.plan.job.restart.elastic_min_workers;
    const std::string reason = job.restart_reason;
    if (min_workers == 0 || live < min_workers) {
      Finish(job, v1::FAILED, TooFewWorkers(reason, ranks, live, min_workers));
      continue;
    }
    SPDLOG_WARN("{}: {} of the {} workers it was to restart on are live",
                job.info.id(), live, ranks);
    if (LayOutOn(job, live, reason)) MarkChanged();
  }
}

void JobManager::PrepareNextAttempt(JobRecord& job, const std::string& reason,
                                    bool counted) {
  // The next attempt starts from the newest step this job committed, or
  // where the job itself started.
  if (job.committed.has_value()) job.resume = job.committed;
  const int64_t from = job.resume.has_value() ? job.resume->step : 0;
  ++job.attempt;
  job.secret = MakeSecret();
  job.info.clear_worker_ids();
  for (v1::StagePlacement& p : *job.info.mutable_stages()) p.clear_worker_id();
  job.ranks.Clear();
  job.failing = false;
  job.failure.clear();
  job.no_restart.clear();
  job.stepped = false;
  job.programs_sent = false;
  job.profiling = false;
  job.profile_requested = false;
  job.steps.ClearPending();
  job.checkpoints.Stop();
  job.draining = false;
  job.drain_reason.clear();
  job.drain_points.clear();
  job.drain_step = 0;
  v1::Job& info = job.info;
  if (counted) info.set_restarts(info.restarts() + 1);
  info.set_last_restart_reason(reason);
  info.set_steps_done(from);
  if (job.resume.has_value()) {
    info.set_resumed_from_step(job.resume->step);
    info.set_resumed_from(job.resume->step_dir);
  }
  const std::string resuming =
      from > 0 ? absl::StrCat("step ", from) : "the start";
  if (counted) {
    SPDLOG_WARN("{}: restart {} of {} after: {}; resuming from {}", info.id(),
                info.restarts(), info.max_restarts(), reason, resuming);
  } else {
    SPDLOG_INFO("{}: queued again after: {}; resuming from {}", info.id(),
                reason, resuming);
  }
}

absl::Status JobManager::Relayout(JobRecord& job, int ranks,
                                  const std::string& reason) {
  const int previous = job.relayout_ranks;
  job.relayout_ranks = ranks == job.file_ranks ? 0 : ranks;
  // The checkpoint's cut is the old layout's: a stages: auto job is cut
  // anew rather than adopting it.
  if (job.resume.has_value()) job.resume->other_layout = true;
  if (absl::Status s = Replan(job); !s.ok()) {
    job.relayout_ranks = previous;
    return s;
  }
  job.layout_reason =
      absl::StrCat(reason, "; laid out on ", ranks, " of the ", job.file_ranks,
                   " workers its file asks for");
  SPDLOG_WARN("{}: {}", job.info.id(), job.layout_reason);
  return absl::OkStatus();
}

void JobManager::RecordLayout(JobRecord& job) {
  v1::JobLayout layout;
  layout.set_from_step(job.resume.has_value() ? job.resume->step : 0);
  layout.set_num_workers(job.plan.num_ranks);
  layout.set_num_stages(job.plan.num_stages);
  for (const StagePlan& s : job.plan.stages) {
    layout.add_stage_begin(s.first_layer);
  }
  auto& layouts = *job.info.mutable_layouts();
  const bool same =
      !layouts.empty() &&
      layouts.rbegin()->num_workers() == layout.num_workers() &&
      std::equal(layouts.rbegin()->stage_begin().begin(),
                 layouts.rbegin()->stage_begin().end(),
                 layout.stage_begin().begin(), layout.stage_begin().end());
  const std::string reason = std::exchange(job.layout_reason, "");
  // Every attempt after the first has its entry, on the same layout too
  // (a restart that kept it once left no trace here, though `restarts`
  // counted it): where it resumed and why.
  if (!layouts.empty()) {
    std::string why = reason;
    if (why.empty()) why = job.info.last_restart_reason();
    if (why.empty()) why = "re-planned";
    if (same) absl::StrAppend(&why, "; same layout");
    layout.set_reason(std::move(why));
  }
  *job.info.add_layouts() = std::move(layout);
  // Bounded: the first and the newest, for a job that restarts for weeks.
  constexpr int kMaxLayouts = 64;
  if (layouts.size() > kMaxLayouts) {
    layouts.DeleteSubrange(1, layouts.size() - kMaxLayouts);
  }
}

void JobManager::Finish(JobRecord& job, v1::JobState state,
                        const std::string& message) {
  if (proto::IsTerminal(job.info.state())) return;
  const bool was_queued = job.info.state() == v1::QUEUED;
  job.info.set_message(message);
  job.info.set_ended_unix_ms(NowUnixMs());
  job.failing = false;
  job.steps.ClearPending();
  if (was_queued) {
    queue_.Remove(job.number);
    UpdateQueuePositions();
  } else {
    StopWorkers(job, message.empty() ? std::string(proto::JobStateName(state))
                                     : message);
  }
  if (state == v1::SUCCEEDED) {
    SPDLOG_INFO("{} SUCCEEDED after {} steps", job.info.id(),
                job.info.steps_done());
  } else {
    SPDLOG_WARN("{} {}: {}", job.info.id(),
                std::string(proto::JobStateName(state)), message);
  }
  job.info.set_queue_position(0);
  job.info.clear_queue_reason();
  SetState(job, state);
  if (options_.observer != nullptr) options_.observer->OnFinished(job.info);
  // A finished job keeps only its newest events (a watcher that is behind
  // skips older ones, as it would while the job ran), and only the newest
  // max_finished_jobs finished jobs are kept at all, so a coordinator that
  // runs for months does not grow with its history.
  job.events.KeepNewest(options_.events_per_finished_job);
  // Nor does it need its parsed job, action lists, parameter names or YAML
  // (GetTrace still reads the plan's ranks and stages).
  job.plan.job = job::JobSpec();
  job.plan.schedule.actions.clear();
  job.plan.schedule.actions.shrink_to_fit();
  for (StagePlan& s : job.plan.stages) {
    s.parameter_names.clear();
    s.parameter_names.shrink_to_fit();
  }
  job.parsed.spec = job::JobSpec();
  job.parsed.yaml.clear();
  finished_jobs_.push_back(job.number);
  const uint64_t finished_number = job.number;
  if (!job.steps.timelines().empty()) {
    finished_traces_.push_back(job.number);
    while (static_cast<int>(finished_traces_.size()) >
           options_.trace_finished_jobs) {
      jobs_.at(finished_traces_.front()).steps.ClearTimelines();
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
  }
}

void JobManager::StopWorkers(JobRecord& job, const std::string& reason) {
  if (!job.programs_sent) {
    // Only the first worker may have heard of the job (asked to profile
    // it); the others are free at once.
    job.profiling = false;
    for (int r = job.profile_requested ? 1 : 0; r < job.info.worker_ids_size();
         ++r) {
      WorkerRecord* w = workers_.Find(job.info.worker_ids(r));
      if (w != nullptr && w->info.job_id() == job.info.id()) {
        ReleaseWorker(*w);
        job.ranks.MarkEnded(r);
      }
    }
  }
  v1::CoordinatorMessage m;
  m.mutable_cancel()->set_job_id(job.info.id());
  m.mutable_cancel()->set_reason(reason);
  SendToRunningRanks(job, m);
}

void JobManager::SendToRunningRanks(JobRecord& job,
                                    const v1::CoordinatorMessage& message) {
  const auto& ids = job.info.worker_ids();
  for (int r = 0; r < ids.size(); ++r) {
    WorkerRecord* w = workers_.Find(ids[r]);
    if (!job.ranks.ended(r) && w != nullptr &&
        w->info.job_id() == job.info.id() && w->info.state() == v1::BUSY) {
      w->connection->Send(message);
    }
  }
}

void JobManager::SetState(JobRecord& job, v1::JobState state) {
  CONVEYOR_CHECK(CanMoveJob(job.info.state(), state),
                 absl::StrCat(job.info.id(), " cannot move from ",
                              proto::JobStateName(job.info.state()), " to ",
                              proto::JobStateName(state)));
  job.info.set_state(state);
  AddEvent(job, nullptr);
  MarkChanged();
}

void JobManager::AddEvent(JobRecord& job, const v1::StepSummary* step) {
  v1::JobEvent event;
  *event.mutable_job() = job.info;
  if (step != nullptr) *event.mutable_step() = *step;
  job.events.Add(std::move(event));
  ++event_count_;
  events_cv_.NotifyAll();
}

void JobManager::ReleaseWorker(WorkerRecord& w) {
  if (w.info.state() != v1::BUSY) return;
  w.info.set_state(v1::IDLE);
  w.info.clear_job_id();
  w.info.clear_stages();
  w.info.clear_data_endpoint();
  LeaveIfDrained(w);
}

}  // namespace conveyor::coordinator
