// JobRun (coordinator/job_run.h), continued: a failed attempt's restart
// (FailOrRestart, Requeue, PrepareNextAttempt) and the plans and layouts of
// the next attempt (Replan, Relayout, LayOutOn), with the description of a
// plan in Job (DescribePlan, RecordLayout).
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/resume.h"
#include "common/status_macros.h"
#include "coordinator/job_run.h"
#include "job/job_spec.h"
#include "job/parsed_job.h"
#include "job/planner.h"
#include "proto/protocol.h"
#include "scheduler/schedule.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

using job::JobPlan;
using job::PlanJob;
using job::StagePlan;

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

// ---------------------------------------------------------------------------
// Restarts.

void JobRun::FailOrRestart(const std::string& reason, absl::string_view kind) {
  const v1::Job& info = job_.info;
  if (proto::IsTerminal(info.state())) return;
  // The next attempt resumes from the newest commit.
  SettleCommits();
  if (proto::IsTerminal(info.state())) return;
  const bool placed =
      info.state() == v1::PLANNING || info.state() == v1::RUNNING;
  if (!job_.no_restart.empty() && info.max_restarts() > 0 &&
      info.restarts() < info.max_restarts()) {
    Finish(v1::FAILED,
           absl::StrCat(reason, " (not restarted: ", job_.no_restart, ")"));
    return;
  }
  if (!placed || info.restarts() >= info.max_restarts()) {
    Finish(v1::FAILED,
           info.max_restarts() > 0
               ? absl::StrCat(reason, " (after ", info.restarts(), " of ",
                              info.max_restarts(), " restarts)")
               : reason);
    return;
  }
  // The final step is committed: the job's result is complete and durable,
  // whatever happened to a worker while it reported its end.
  if (job_.committed.has_value() &&
      job_.committed->step >= info.steps_total()) {
    Finish(v1::SUCCEEDED, "");
    return;
  }
  Requeue(reason, kind, /*drained=*/false);
}

void JobRun::Requeue(std::string reason, absl::string_view kind, bool drained) {
  // The file's layout when enough workers are live (so an elastic job goes
  // back to it once they are), else, elastic, as many as are.
  const int live =
      ctx_.workers().Live(job_.plan.job.pipeline.devices_per_stage);
  const int64_t min_workers = job_.plan.job.restart.elastic_min_workers;
  // (file_ranks is set by submission and by Replan; the plan's count is
  // the file's unless the job was laid out anew.)
  int ranks = job_.file_ranks > 0 ? job_.file_ranks : job_.plan.num_ranks;
  if (live < ranks && (min_workers == 0 || live < min_workers) && drained) {
    // Nothing was lost: the job waits at the head of the queue for the
    // workers its layout needs (a replacement for the drained one).
    SPDLOG_WARN("{}: waits for {} workers ({} live)", job_.info.id(), ranks,
                live);
  } else if (live < ranks) {
    if (min_workers == 0 || live < min_workers) {
      Finish(v1::FAILED, TooFewWorkers(reason, ranks, live, min_workers));
      return;
    }
    ranks = live;
  }
  StopWorkers(reason);
  PrepareNextAttempt(reason, /*counted=*/!drained);
  const bool layout_changed = ranks != job_.plan.num_ranks;
  if (layout_changed && !LayOutOn(ranks, reason)) return;
  // Until it is placed, every change of the fleet re-examines it
  // (Placer::ReexamineRestarts): a worker this count took for live may be
  // lost next, as when two die at once.
  if (!drained) job_.restart_reason = reason;
  // At the head: the job was running, and a restart must not wait behind
  // work submitted after it.
  ctx_.queue().AddFirst(job_.number, job_.info.priority(),
                        ctx_.options().clock(),
                        std::chrono::milliseconds(job_.info.queued_wait_ms()));
  ctx_.UpdateQueuePositions();
  SetState(v1::QUEUED);
  if (JobObserver* observer = ctx_.options().observer; observer != nullptr) {
    observer->OnRestarted(job_.info, kind, layout_changed);
  }
}

void JobRun::PrepareNextAttempt(const std::string& reason, bool counted) {
  // The next attempt starts from the newest step this job committed, or
  // where the job itself started.
  if (job_.committed.has_value()) job_.resume = job_.committed;
  const int64_t from = job_.resume.has_value() ? job_.resume->step : 0;
  ++job_.attempt;
  job_.secret = MakeSecret();
  job_.info.clear_worker_ids();
  for (v1::StagePlacement& p : *job_.info.mutable_stages()) p.clear_worker_id();
  job_.ranks.Clear();
  job_.failing = false;
  job_.failure.clear();
  job_.preempting = false;
  job_.no_restart.clear();
  job_.stepped = false;
  job_.programs_sent = false;
  job_.profiling = false;
  job_.profile_requested = false;
  job_.steps.ClearPending();
  job_.checkpoints.Stop();
  job_.draining = false;
  job_.drain_reason.clear();
  job_.drain_points.clear();
  job_.drain_step = 0;
  v1::Job& info = job_.info;
  if (counted) info.set_restarts(info.restarts() + 1);
  info.set_last_restart_reason(reason);
  info.set_steps_done(from);
  if (job_.resume.has_value()) {
    info.set_resumed_from_step(job_.resume->step);
    info.set_resumed_from(job_.resume->step_dir);
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

void JobRun::ReexamineRestart() {
  if (job_.info.state() != v1::QUEUED || job_.restart_reason.empty()) return;
  const int live =
      ctx_.workers().Live(job_.plan.job.pipeline.devices_per_stage);
  const int ranks = job_.plan.num_ranks;
  if (live >= ranks) return;
  const int64_t min_workers = job_.plan.job.restart.elastic_min_workers;
  const std::string reason = job_.restart_reason;
  if (min_workers == 0 || live < min_workers) {
    Finish(v1::FAILED, TooFewWorkers(reason, ranks, live, min_workers));
    return;
  }
  SPDLOG_WARN("{}: {} of the {} workers it was to restart on are live",
              job_.info.id(), live, ranks);
  if (LayOutOn(live, reason)) ctx_.MarkJobChanged(job_.number);
}

// ---------------------------------------------------------------------------
// Plans and layouts.

bool JobRun::LayOutOn(int ranks, const std::string& reason) {
  // A schedule may not plan on every worker count (interleaved-1f1b needs
  // M to be a multiple of P): fewer workers, down to the minimum, before
  // giving up.
  const int64_t min_workers = job_.plan.job.restart.elastic_min_workers;
  absl::Status laid_out = absl::UnknownError("no worker count tried");
  const int lowest = ranks < job_.file_ranks
                         ? static_cast<int>(std::max<int64_t>(min_workers, 1))
                         : ranks;
  absl::Status first_failure;
  for (int r = ranks; r >= lowest && !laid_out.ok(); --r) {
    laid_out = Relayout(r, reason);
    if (r == ranks) first_failure = laid_out;
  }
  if (laid_out.ok()) {
    // Why workers that are live sit idle (interleaved-1f1b on 3 of 3 live
    // workers with 4 microbatches, say): `status` shows it with the layout.
    if (!first_failure.ok()) {
      absl::StrAppend(&job_.layout_reason, "; not on ", ranks, ": ",
                      first_failure.message());
    }
    return true;
  }
  Finish(v1::FAILED,
         absl::StrCat(reason,
                      "; not restarted: the job cannot be laid "
                      "out on ",
                      lowest == ranks ? absl::StrCat(ranks)
                                      : absl::StrCat(lowest, " to ", ranks),
                      " workers: ", laid_out.message()));
  return false;
}

absl::Status JobRun::Relayout(int ranks, const std::string& reason) {
  const int previous = job_.relayout_ranks;
  job_.relayout_ranks = ranks == job_.file_ranks ? 0 : ranks;
  // The checkpoint's cut is the old layout's: a stages: auto job is cut
  // anew rather than adopting it.
  if (job_.resume.has_value()) job_.resume->other_layout = true;
  if (absl::Status s = Replan(); !s.ok()) {
    job_.relayout_ranks = previous;
    return s;
  }
  job_.layout_reason =
      absl::StrCat(reason, "; laid out on ", ranks, " of the ", job_.file_ranks,
                   " workers its file asks for");
  SPDLOG_WARN("{}: {}", job_.info.id(), job_.layout_reason);
  return absl::OkStatus();
}

absl::Status JobRun::Replan() {
  // The plan's copy: a relayout and a checkpoint's cut change it, never the
  // parsed file.
  absl::StatusOr<job::JobSpec> spec = job_.parsed.spec;
  if (job_.file_ranks == 0) {
    ASSIGN_OR_RETURN(const JobPlan file_plan, PlanJob(*spec));
    job_.file_ranks = file_plan.num_ranks;
  }
  if (job_.relayout_ranks > 0) {
    ASSIGN_OR_RETURN(spec,
                     job::RelayoutOnto(*std::move(spec), job_.relayout_ranks));
  }
  if (job_.resume.has_value()) {
    RETURN_IF_ERROR(checkpoint::AdoptCheckpointCut(*job_.resume, *spec));
  }
  ASSIGN_OR_RETURN(JobPlan plan, PlanJob(*std::move(spec)));
  if (job_.resume.has_value()) {
    RETURN_IF_ERROR(checkpoint::CheckResumeFitsPlan(*job_.resume, plan));
  }
  job_.plan = std::move(plan);
  DescribePlan();
  return absl::OkStatus();
}

void JobRun::DescribePlan() {
  const job::JobSpec& spec = job_.plan.job;
  job_.rates.samples_per_step = static_cast<double>(spec.training.batch_size);
  job_.rates.tokens_per_sample = 0;
  if (spec.model.token_input) {
    job_.rates.tokens_per_sample = 1;
    for (int64_t d : spec.model.input_shape) job_.rates.tokens_per_sample *= d;
  }
  job_.rates.flops_per_sample = spec.model.TrainingFlopsPerSample();
  job_.rates.devices_per_rank =
      static_cast<int>(spec.pipeline.devices_per_stage);
  v1::Job& info = job_.info;
  info.set_steps_total(spec.training.steps);
  info.set_checkpoint_every(
      spec.checkpoint.dir.empty() ? 0 : spec.checkpoint.every);
  // schedule: auto stays "auto" until ChooseStages picks (the provisional
  // plan's 1f1b is nobody's choice).
  info.set_schedule(
      job::NeedsProfile(job_.plan) && spec.pipeline.auto_schedule
          ? std::string("auto")
          : std::string(scheduler::ScheduleKindName(job_.plan.schedule.kind)));
  info.set_num_stages(job_.plan.num_stages);
  info.set_num_workers(job_.plan.num_ranks);
  info.set_virtual_stages(job_.plan.virtual_stages);
  info.set_batch_size(spec.training.batch_size);
  info.set_microbatches(static_cast<int32_t>(spec.training.microbatches));
  info.set_devices_per_stage(
      static_cast<int32_t>(spec.pipeline.devices_per_stage));
  info.set_tensor_parallel(static_cast<int32_t>(spec.pipeline.tensor_parallel));
  info.set_checkpoint_dir(spec.checkpoint.dir);
  info.set_max_restarts(static_cast<int32_t>(spec.restart.max_restarts));
  info.clear_stages();
  for (const StagePlan& s : job_.plan.stages) {
    v1::StagePlacement* p = info.add_stages();
    p->set_stage(s.stage);
    p->set_rank(s.rank);
    p->set_first_layer(s.first_layer);
    p->set_num_layers(s.num_layers);
    p->set_num_params(s.num_params);
  }
  info.clear_auto_split();
  if (spec.pipeline.auto_stages) {
    info.mutable_auto_split()->set_chosen(false);
    info.mutable_auto_split()->set_schedule_auto(spec.pipeline.auto_schedule);
  }
}

void JobRun::RecordLayout() {
  v1::JobLayout layout;
  layout.set_from_step(job_.resume.has_value() ? job_.resume->step : 0);
  layout.set_num_workers(job_.plan.num_ranks);
  layout.set_num_stages(job_.plan.num_stages);
  for (const StagePlan& s : job_.plan.stages) {
    layout.add_stage_begin(s.first_layer);
  }
  auto& layouts = *job_.info.mutable_layouts();
  const bool same =
      !layouts.empty() &&
      layouts.rbegin()->num_workers() == layout.num_workers() &&
      std::equal(layouts.rbegin()->stage_begin().begin(),
                 layouts.rbegin()->stage_begin().end(),
                 layout.stage_begin().begin(), layout.stage_begin().end());
  const std::string reason = std::exchange(job_.layout_reason, "");
  // Every attempt after the first has its entry, on the same layout too
  // (a restart that kept it once left no trace here, though `restarts`
  // counted it): where it resumed and why.
  if (!layouts.empty()) {
    std::string why = reason;
    if (why.empty()) why = job_.info.last_restart_reason();
    if (why.empty()) why = "re-planned";
    if (same) absl::StrAppend(&why, "; same layout");
    layout.set_reason(std::move(why));
  }
  *job_.info.add_layouts() = std::move(layout);
  // Bounded: the first and the newest, for a job that restarts for weeks.
  constexpr int kMaxLayouts = 64;
  if (layouts.size() > kMaxLayouts) {
    layouts.DeleteSubrange(1, layouts.size() - kMaxLayouts);
  }
}

}  // namespace conveyor::coordinator
