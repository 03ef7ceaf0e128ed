// JobRun (coordinator/job_run.h): its ranks' reports, the commit of a
// checkpoint, its deadlines and its end. Its restarts and the plans of its
// next attempts are in job_run_restart.cc, its drain in job_run_drain.cc.
#include "coordinator/job_run.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/directory.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "common/check.h"
#include "coordinator/data_plane_choice.h"
#include "coordinator/job_states.h"
#include "coordinator/metrics_log.h"
#include "job/job_spec.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

using job::StagePlan;

namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

JobRun::JobRun(JobRunContext& context, uint64_t number)
    : ctx_(context),
      job_(context.options().max_events_per_job,
           context.options().trace_steps) {
  job_.number = number;
}

std::string JobRun::MakeSecret() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&out, absl::Hex(rd(), absl::kZeroPad8));
  }
  return out;
}

int JobRun::RankOf(const WorkerRecord& w) const {
  const auto& ids = job_.info.worker_ids();
  return static_cast<int>(std::find(ids.begin(), ids.end(), w.info.id()) -
                          ids.begin());
}

// ---------------------------------------------------------------------------
// Reports.

void JobRun::OnReady(WorkerRecord& w, const v1::JobReady& ready) {
  if (job_.info.state() != v1::PLANNING || w.info.job_id() != ready.job_id()) {
    return;  // Late: the job ended meanwhile.
  }
  const auto& ids = job_.info.worker_ids();
  const int rank = RankOf(w);
  if (rank >= ids.size() || job_.ranks.is_ready(rank)) return;
  if (ready.data_endpoint().empty()) {
    Finish(v1::FAILED,
           absl::StrCat(ctx_.DescribeWorker(w), " reported no data endpoint"));
    return;
  }
  job_.ranks.MarkReady(rank, ready);
  w.info.set_data_endpoint(ready.data_endpoint());
  if (!job_.ranks.all_ready()) return;
  const DataPlaneChoice plane = ChooseDataPlane(job_.ranks.ready_reports());
  // The MFU's denominator: each rank's devices at the job's precision. One
  // rank of unknown peak leaves the job without MFU rather than a wrong one.
  job_.rates.peak_flops = 0;
  for (const v1::JobReady& r : job_.ranks.ready_reports()) {
    if (!(r.peak_flops() > 0) || !std::isfinite(r.peak_flops())) {
      job_.rates.peak_flops = 0;
      break;
    }
    job_.rates.peak_flops += r.peak_flops();
  }
  job_.info.set_data_plane(plane.description);
  SPDLOG_INFO("{}: tensors over {}", job_.info.id(), plane.description);
  v1::CoordinatorMessage m;
  m.mutable_start()->set_job_id(job_.info.id());
  m.mutable_start()->set_nccl(plane.nccl);
  for (const std::string& e : job_.ranks.endpoints()) {
    m.mutable_start()->add_peers(e);
  }
  WorkerRegistry& workers = ctx_.workers();
  for (const std::string& id : ids) {
    const WorkerRecord* peer = workers.Find(id);
    m.mutable_start()->add_peer_names(peer != nullptr ? peer->info.name() : id);
  }
  job_.info.set_started_unix_ms(NowUnixMs());
  SetState(v1::RUNNING);
  for (const std::string& id : ids) {
    WorkerRecord* peer = workers.Find(id);
    if (peer != nullptr) peer->connection->Send(m);
  }
}

void JobRun::OnStep(WorkerRecord& w, const v1::StepReport& report) {
  if (job_.info.state() != v1::RUNNING || w.info.job_id() != report.job_id()) {
    return;
  }
  const int rank = RankOf(w);
  const int p = job_.plan.num_ranks;
  if (rank >= p || report.step() < 1 ||
      report.step() > job_.info.steps_total()) {
    return;
  }
  std::optional<v1::StepSummary> summary =
      job_.steps.Add(rank, p, report, job_.rates);
  if (!summary.has_value()) return;
  const v1::StepSummary& s = *summary;
  v1::Job& info = job_.info;
  info.set_steps_done(std::max(info.steps_done(), s.step()));
  job_.stepped = true;
  job_.attempts_lost_before_a_step = 0;
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
  AddEvent(&s);
  JobObserver* observer = ctx_.options().observer;
  if (observer != nullptr) observer->OnStep(info, s);
  if (const std::string& dir = job_.plan.job.checkpoint.dir; !dir.empty()) {
    // A job's first step from scratch starts the file over: an earlier run
    // in the directory (`run --overwrite`) is not this job's history.
    const bool start_over =
        s.step() == 1 && !job_.resume.has_value() && info.restarts() == 0;
    if (absl::Status logged = AppendMetricsLog(
            dir, MetricsLogLine(s, NowUnixMs(), info.restarts()), start_over);
        !logged.ok() && !job_.metrics_log_failed) {
      // Once per job: a full disk must not fill the log too.
      job_.metrics_log_failed = true;
      SPDLOG_WARN("{}: no step history: {}", info.id(),
                  std::string(logged.message()));
    }
  }
}

void JobRun::OnEnded(WorkerRecord& w, const v1::JobEnded& ended) {
  // The worker's message already names its rank and stages.
  const std::string who = absl::StrCat(w.info.id(), " (", w.info.name(), ")");
  ctx_.ReleaseWorker(w);
  const auto& ids = job_.info.worker_ids();
  const int rank = RankOf(w);
  if (rank >= ids.size()) return;
  job_.ranks.MarkEnded(rank);
  if (proto::IsTerminal(job_.info.state())) return;
  // What follows reads the newest commit.
  SettleCommits();
  if (proto::IsTerminal(job_.info.state())) return;
  const bool all_ended = job_.ranks.all_ended();
  if (ended.drained_after_step() > 0 && job_.draining && !job_.failing &&
      ended.drained_after_step() == job_.drain_step) {
    if (all_ended) FinishDrain();
    return;
  }
  if (ended.state() == v1::SUCCEEDED) {
    if (all_ended && !job_.failing) {
      // Every rank wrote its final files before reporting success, so the
      // last step is committed by now unless a report went missing.
      const int64_t last = job_.info.steps_total();
      if (!job_.plan.job.checkpoint.dir.empty() &&
          job_.info.last_checkpoint_step() != last) {
        Finish(v1::FAILED,
               absl::StrCat("the final checkpoint (step ", last,
                            ") is incomplete: not every stage reported its "
                            "file"));
      } else {
        Finish(v1::SUCCEEDED, "");
      }
    } else if (all_ended) {
      FailOrRestart(job_.failure, "rank_failed");
    }
    return;
  }
  if (!job_.failing) {
    job_.failing = true;
    job_.failure = absl::StrCat(who, ": ", ended.message());
    // A worker that could not prepare the job for a reason in the job
    // itself (too large for the machine, a bad file, an invalid setting)
    // would fail the same way on any other: no restart.
    const auto code = static_cast<absl::StatusCode>(ended.code());
    if (job_.info.state() == v1::PLANNING &&
        (code == absl::StatusCode::kInvalidArgument ||
         code == absl::StatusCode::kResourceExhausted ||
         code == absl::StatusCode::kFailedPrecondition ||
         code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kPermissionDenied)) {
      job_.no_restart =
          "preparing the job failed for a reason of its own, which another "
          "attempt would meet too";
    } else if (job_.info.state() == v1::PLANNING &&
               code == absl::StatusCode::kDataLoss) {
      // A damaged checkpoint file: the next attempt would resume from the
      // same step and read the same bytes, so restarts would only be used
      // up one by one before the job fails anyway.
      job_.no_restart =
          "the checkpoint it resumes from is damaged, and another attempt "
          "would read the same files; resubmit with resume: set to an "
          "older step directory";
    }
    job_.failure_deadline =
        ctx_.options().clock() + ctx_.options().failure_grace;
    // Stop the others now; the job's final state waits for the grace.
    v1::CoordinatorMessage m;
    m.mutable_cancel()->set_job_id(job_.info.id());
    m.mutable_cancel()->set_reason(job_.failure);
    SendToRunningRanks(m);
  }
  // Every worker has answered, so none was lost: no reason to wait.
  if (all_ended) FailOrRestart(job_.failure, "rank_failed");
}

void JobRun::OnCheckpoint(WorkerRecord& w, const v1::CheckpointSaved& saved) {
  if (job_.info.state() != v1::RUNNING || w.info.job_id() != saved.job_id() ||
      job_.plan.job.checkpoint.dir.empty()) {
    return;  // Late: the job ended or restarted meanwhile.
  }
  const int rank = RankOf(w);
  if (rank >= job_.info.worker_ids_size()) return;
  absl::StatusOr<std::optional<CheckpointCollector::StepFiles>> complete =
      job_.checkpoints.Add(rank, saved.step(), saved.files());
  if (!complete.ok()) {
    FailOrRestart(
        absl::StrCat(ctx_.DescribeWorker(w), " ", complete.status().message()),
        "bad_report");
    return;
  }
  if (complete->has_value()) CommitCheckpoint(saved.step(), **complete);
}

void JobRun::CommitCheckpoint(int64_t step,
                              const std::map<int, v1::StageFile>& files) {
  const JobManagerOptions& options = ctx_.options();
  CheckpointCommits::Commit commit{
      .job_id = job_.info.id(),
      .dir = job_.plan.job.checkpoint.dir,
      .manifest = checkpoint::MakeManifest(
          job_.plan, job_.info.id(), job_.parsed.config_hash,
          job_.parsed.training_hash, job_.parsed.yaml, step, files,
          NowUnixMs()),
      .keep_latest = static_cast<int>(
          std::max<int64_t>(0, job_.plan.job.checkpoint.keep_latest)),
      .before_write = options.TEST_before_manifest,
  };
  if (step == options.TEST_fault_commit_step) {
    commit.pause = options.TEST_fault_commit_delay;
  }
  job_.commits->Enqueue(std::move(commit));
  // Written after the manager's lock is released, where the manager can;
  // here and now otherwise.
  if (!ctx_.WriteCommitsOutsideLock(job_.number, job_.commits)) {
    SettleCommits();
  }
}

void JobRun::SettleCommits() {
  job_.commits->Flush();
  ApplyWrittenCommits();
}

void JobRun::ApplyWrittenCommits() {
  std::string failure;
  for (CheckpointCommits::Written& written : job_.commits->TakeWritten()) {
    if (!written.status.ok()) {
      if (failure.empty()) {
        failure =
            absl::StrCat("committing the checkpoint of step ", written.step,
                         " failed: ", written.status.message());
      }
      continue;
    }
    if (!job_.committed.has_value() || job_.committed->step < written.step) {
      job_.committed = *std::move(written.point);
      job_.info.set_last_checkpoint_step(written.step);
      job_.info.set_last_checkpoint_unix_ms(NowUnixMs());
    }
    ctx_.MarkJobChanged(job_.number);
    SPDLOG_INFO(
        "{}: checkpoint of step {} complete in {}", job_.info.id(),
        written.step,
        checkpoint::StepDirPath(job_.plan.job.checkpoint.dir, written.step));
    AddEvent(nullptr);
  }
  if (!failure.empty()) Finish(v1::FAILED, failure);
}

void JobRun::CheckDeadlines(TimePoint now) {
  const JobManagerOptions& options = ctx_.options();
  if (job_.info.state() == v1::PLANNING && now > job_.prepare_deadline) {
    std::vector<std::string> slow;
    for (int r = 0; r < job_.info.worker_ids_size(); ++r) {
      if (!job_.ranks.is_ready(r)) slow.push_back(job_.info.worker_ids(r));
    }
    FailOrRestart(
        job_.profiling
            ? absl::StrFormat(
                  "%s did not report its layer profile within %.0f s",
                  job_.info.worker_ids(0), Seconds(options.prepare_timeout))
            : absl::StrFormat("%s did not report ready within %.0f s",
                              absl::StrJoin(slow, ", "),
                              Seconds(options.prepare_timeout)),
        "timeout");
  }
  if (job_.failing && now >= job_.failure_deadline) {
    FailOrRestart(job_.failure, "rank_failed");
  }
  if (job_.draining && job_.drain_step == 0 && now > job_.drain_deadline &&
      job_.info.state() == v1::RUNNING) {
    std::vector<std::string> silent;
    for (int r = 0; r < job_.info.worker_ids_size(); ++r) {
      if (!job_.drain_points.contains(r) && !job_.ranks.ended(r)) {
        silent.push_back(job_.info.worker_ids(r));
      }
    }
    FailOrRestart(absl::StrFormat("%s did not answer the drain within %.1f s",
                                  absl::StrJoin(silent, ", "),
                                  Seconds(options.heartbeat_timeout)),
                  "timeout");
  }
}

absl::StatusOr<v1::Trace> JobRun::Trace(int64_t step) const {
  const std::string& id = job_.info.id();
  const std::deque<StepAggregator::Timelines>& kept = job_.steps.timelines();
  if (kept.empty() && proto::IsTerminal(job_.info.state()) &&
      job_.info.steps_done() > 0) {
    return absl::NotFoundError(absl::StrCat(
        id,
        "'s timelines are no longer kept: the coordinator keeps those of "
        "the newest ",
        ctx_.options().trace_finished_jobs, " ended jobs"));
  }
  if (kept.empty()) {
    return absl::NotFoundError(
        absl::StrCat(id, " has no complete step yet (",
                     proto::JobStateName(job_.info.state()), ")"));
  }
  const StepAggregator::Timelines* found = job_.steps.Find(step);
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        id, " step ", step, " is not kept; timelines are kept for steps ",
        kept.front().first, " to ", kept.back().first));
  }
  v1::Trace trace;
  trace.set_job_id(id);
  trace.set_job_name(job_.info.name());
  trace.set_step(found->first);
  trace.set_schedule(job_.info.schedule());
  trace.set_num_ranks(job_.plan.num_ranks);
  trace.set_virtual_stages(job_.plan.virtual_stages);
  trace.set_microbatches(job_.info.microbatches());
  for (const auto& entry : kept) trace.add_available_steps(entry.first);
  for (int r = 0; r < static_cast<int>(found->second.size()); ++r) {
    const v1::StepReport& report = found->second[r];
    v1::RankTrace* rank = trace.add_ranks();
    rank->set_rank(r);
    if (r < job_.info.worker_ids_size()) {
      rank->set_worker_id(job_.info.worker_ids(r));
      if (const WorkerRecord* w =
              ctx_.workers().Find(job_.info.worker_ids(r))) {
        rank->set_worker_name(w->info.name());
      }
    }
    for (const StagePlan& s : job_.plan.stages) {
      if (s.rank == r) rank->add_stages(s.stage);
    }
    rank->set_start_unix_us(report.start_unix_us());
    rank->set_seconds(report.seconds());
    *rank->mutable_spans() = report.spans();
  }
  return trace;
}

// ---------------------------------------------------------------------------
// States.

void JobRun::Finish(v1::JobState state, const std::string& message) {
  if (proto::IsTerminal(job_.info.state())) return;
  // Every step the ranks completed is committed before the job ends: a
  // failed commit ends it FAILED (through here), and none comes after.
  SettleCommits();
  if (proto::IsTerminal(job_.info.state())) return;
  const bool was_queued = job_.info.state() == v1::QUEUED;
  job_.info.set_message(message);
  job_.info.set_ended_unix_ms(NowUnixMs());
  job_.failing = false;
  job_.steps.ClearPending();
  if (was_queued) {
    ctx_.queue().Remove(job_.number);
    ctx_.UpdateQueuePositions();
  } else {
    StopWorkers(message.empty() ? std::string(proto::JobStateName(state))
                                : message);
  }
  if (state == v1::SUCCEEDED) {
    SPDLOG_INFO("{} SUCCEEDED after {} steps", job_.info.id(),
                job_.info.steps_done());
  } else {
    SPDLOG_WARN("{} {}: {}", job_.info.id(),
                std::string(proto::JobStateName(state)), message);
  }
  job_.info.set_queue_position(0);
  job_.info.clear_queue_reason();
  SetState(state);
  if (JobObserver* observer = ctx_.options().observer; observer != nullptr) {
    observer->OnFinished(job_.info);
  }
  // A finished job keeps only its newest events (a watcher that is behind
  // skips older ones, as it would while the job ran), and only the newest
  // max_finished_jobs finished jobs are kept at all (OnJobEnded), so a
  // coordinator that runs for months does not grow with its history.
  job_.events.KeepNewest(ctx_.options().events_per_finished_job);
  // Nor does it need its parsed job, action lists, parameter names or YAML
  // (GetTrace still reads the plan's ranks and stages).
  job_.plan.job = job::JobSpec();
  job_.plan.schedule.actions.clear();
  job_.plan.schedule.actions.shrink_to_fit();
  for (StagePlan& s : job_.plan.stages) {
    s.parameter_names.clear();
    s.parameter_names.shrink_to_fit();
  }
  job_.parsed.spec = job::JobSpec();
  job_.parsed.yaml.clear();
  ctx_.OnJobEnded(*this);
}

void JobRun::StopWorkers(const std::string& reason) {
  if (!job_.programs_sent) {
    // Only the first worker may have heard of the job (asked to profile
    // it); the others are free at once.
    job_.profiling = false;
    for (int r = job_.profile_requested ? 1 : 0;
         r < job_.info.worker_ids_size(); ++r) {
      WorkerRecord* w = ctx_.workers().Find(job_.info.worker_ids(r));
      if (w != nullptr && w->info.job_id() == job_.info.id()) {
        ctx_.ReleaseWorker(*w);
        job_.ranks.MarkEnded(r);
      }
    }
  }
  v1::CoordinatorMessage m;
  m.mutable_cancel()->set_job_id(job_.info.id());
  m.mutable_cancel()->set_reason(reason);
  SendToRunningRanks(m);
}

void JobRun::SendToRunningRanks(const v1::CoordinatorMessage& message) {
  const auto& ids = job_.info.worker_ids();
  for (int r = 0; r < ids.size(); ++r) {
    WorkerRecord* w = ctx_.workers().Find(ids[r]);
    if (!job_.ranks.ended(r) && w != nullptr &&
        w->info.job_id() == job_.info.id() && w->info.state() == v1::BUSY) {
      w->connection->Send(message);
    }
  }
}

void JobRun::SetState(v1::JobState state) {
  CONVEYOR_CHECK(CanMoveJob(job_.info.state(), state),
                 absl::StrCat(job_.info.id(), " cannot move from ",
                              proto::JobStateName(job_.info.state()), " to ",
                              proto::JobStateName(state)));
  job_.info.set_state(state);
  AddEvent(nullptr);
  ctx_.MarkJobChanged(job_.number);
}

void JobRun::AddEvent(const v1::StepSummary* step) {
  v1::JobEvent event;
  *event.mutable_job() = job_.info;
  if (step != nullptr) *event.mutable_step() = *step;
  job_.events.Add(std::move(event));
  ctx_.EventAdded(job_.number);
}

}  // namespace conveyor::coordinator
