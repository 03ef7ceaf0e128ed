#include "coordinator/job_manager.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "coordinator/ids.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

using job::StagePlan;
namespace {

// After this many attempts in a row lose a worker before completing a step,
// the job is not restarted again (see MarkLost).
constexpr int kMaxAttemptsLostBeforeAStep = 2;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

JobManager::JobManager(JobManagerOptions options)
    : options_(std::move(options)),
      workers_(options_.version),
      profiles_(options_.max_cached_profiles) {}

JobManager::~JobManager() { Shutdown(); }

// ---------------------------------------------------------------------------
// Workers.

absl::StatusOr<v1::Registered> JobManager::RegisterWorker(
    const v1::RegisterRequest& request,
    std::shared_ptr<WorkerConnection> connection) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(workers_.CheckRequest(request));
  if (shutdown_) return absl::UnavailableError("coordinator shutting down");
  ASSIGN_OR_RETURN(WorkerRecord * added,
                   workers_.Add(request, std::move(connection),
                                options_.clock(), NowUnixMs()));
  WorkerRecord& w = *added;
  SPDLOG_INFO("registered {} ('{}', {}, data plane {})", w.info.id(),
              request.name(), absl::StrJoin(request.devices(), ","),
              request.data_address());
  v1::Registered reply;
  reply.set_worker_id(w.info.id());
  // Four heartbeats per timeout: one or two lost or late ones do not make a
  // live worker look dead.
  reply.set_heartbeat_interval_ms(std::max<int64_t>(
      50, std::chrono::duration_cast<std::chrono::milliseconds>(
              options_.heartbeat_timeout)
                  .count() /
              4));
  // The reply goes out before anything Schedule() may send this worker.
  v1::CoordinatorMessage m;
  *m.mutable_registered() = reply;
  w.connection->Send(m);
  Schedule();
  return reply;
}

absl::Status JobManager::HandleWorkerMessage(const std::string& worker_id,
                                             const v1::WorkerMessage& message) {
  absl::Status status = Dispatch(worker_id, message);
  // A committed checkpoint or a job's end is on disk before the worker's
  // next message is read, not up to a Tick later. (A failure is logged
  // and reported by StateFileError; the next call retries.)
  (void)Persist();
  return status;
}

absl::Status JobManager::Dispatch(const std::string& worker_id,
                                  const v1::WorkerMessage& message) {
  MutexLock lock(mu_);
  WorkerRecord* w = workers_.Find(worker_id);
  if (w == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("unknown worker ", worker_id));
  }
  if (w->info.state() == v1::LOST) {
    return absl::FailedPreconditionError(
        absl::StrCat(worker_id, " was declared lost (", w->info.lost_reason(),
                     "); register again"));
  }
  w->last_seen = options_.clock();
  switch (message.kind_case()) {
    case v1::WorkerMessage::kHeartbeat: {
      // A worker that says it is idle while we still count it busy with a
      // finished job has ended that job (its JobEnded was lost or raced the
      // cancel): free it.
      if (w->info.state() == v1::BUSY && message.heartbeat().job_id().empty()) {
        JobRecord* job = FindJob(w->info.job_id());
        if (job == nullptr || proto::IsTerminal(job->info.state())) {
          ReleaseWorker(*w);
          Schedule();
        }
      }
      return absl::OkStatus();
    }
    case v1::WorkerMessage::kReady:
      OnReady(*w, message.ready());
      return absl::OkStatus();
    case v1::WorkerMessage::kStep:
      OnStep(*w, message.step());
      return absl::OkStatus();
    case v1::WorkerMessage::kProfile:
      OnProfile(*w, message.profile());
      return absl::OkStatus();
    case v1::WorkerMessage::kEnded:
      OnEnded(*w, message.ended());
      Schedule();
      return absl::OkStatus();
    case v1::WorkerMessage::kCheckpoint:
      OnCheckpoint(*w, message.checkpoint());
      return absl::OkStatus();
    case v1::WorkerMessage::kDrainPoint:
      OnDrainPoint(*w, message.drain_point());
      return absl::OkStatus();
    case v1::WorkerMessage::kDrain:
      // The worker's SIGTERM: drain it as conveyorctl drain would.
      // (Its reason reaches logs and events: bounded.)
      StartDrain(*w,
                 absl::StrCat("the worker asked (",
                              message.drain().reason().substr(0, 200), ")"));
      Schedule();
      return absl::OkStatus();
    case v1::WorkerMessage::kDeregister: {
      // Leaving on purpose: its job (if any) fails or restarts as for a
      // loss, and the registry forgets it rather than listing it LOST.
      SPDLOG_INFO("{} deregisters: {}", DescribeWorker(*w),
                  message.deregister().reason());
      MarkLost(*w, absl::StrCat("deregistered (", message.deregister().reason(),
                                ")"));
      workers_.Erase(worker_id);
      Schedule();
      return absl::OkStatus();
    }
    case v1::WorkerMessage::kRegister:
      return absl::FailedPreconditionError(
          absl::StrCat(worker_id, " is already registered"));
    default:
      return absl::InvalidArgumentError("empty worker message");
  }
}

void JobManager::WorkerDisconnected(const std::string& worker_id,
                                    const std::string& reason) {
  MutexLock lock(mu_);
  WorkerRecord* w = workers_.Find(worker_id);
  if (w == nullptr) return;
  MarkLost(*w, reason);
  Schedule();
}

void JobManager::MarkLost(WorkerRecord& w, const std::string& observed) {
  if (w.info.state() == v1::LOST) return;
  const std::string who = DescribeWorker(w);
  SPDLOG_WARN("{} lost: {}", who, observed);
  w.info.set_state(v1::LOST);
  w.info.set_lost_reason(observed);
  if (w.connection != nullptr) {
    w.connection->Close(
        absl::UnavailableError(absl::StrCat("declared lost: ", observed)));
  }
  JobRecord* job = FindJob(w.info.job_id());
  w.info.clear_job_id();
  w.info.clear_stages();
  w.info.clear_data_endpoint();
  // A worker of an earlier attempt, still winding down after a restart,
  // keeps the job's id but is no longer among its workers: its loss ends
  // nothing of the attempt now running.
  const bool in_attempt =
      job != nullptr &&
      std::find(job->info.worker_ids().begin(), job->info.worker_ids().end(),
                w.info.id()) != job->info.worker_ids().end();
  if (in_attempt && !proto::IsTerminal(job->info.state())) {
    // A job that kills its workers (a size no check caught, a crash in
    // its layers) must not be restarted onto the rest of the cluster, one
    // attempt after another. A loss before any step, twice in a row, is
    // taken as the job's doing; one alone may be the machine's.
    if (!job->stepped &&
        ++job->attempts_lost_before_a_step >= kMaxAttemptsLostBeforeAStep) {
      job->no_restart = absl::StrCat(
          job->attempts_lost_before_a_step,
          " attempts in a row lost a worker before completing a step, so the "
          "job itself may be what ends them (too large for the machine?); "
          "check the workers' logs, then resubmit");
    }
    FailOrRestart(*job, absl::StrCat(who, " lost: ", observed), "worker_lost");
  }
}

absl::StatusOr<v1::Trace> JobManager::GetTrace(const std::string& id,
                                               int64_t step) const {
  MutexLock lock(mu_);
  auto it = jobs_.find(JobNumber(id));
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  }
  const JobRecord& job = it->second;
  const std::deque<StepAggregator::Timelines>& kept = job.steps.timelines();
  if (kept.empty() && proto::IsTerminal(job.info.state()) &&
      job.info.steps_done() > 0) {
    return absl::NotFoundError(absl::StrCat(
        id,
        "'s timelines are no longer kept: the coordinator keeps those of "
        "the newest ",
        options_.trace_finished_jobs, " ended jobs"));
  }
  if (kept.empty()) {
    return absl::NotFoundError(
        absl::StrCat(id, " has no complete step yet (",
                     proto::JobStateName(job.info.state()), ")"));
  }
  const StepAggregator::Timelines* found = job.steps.Find(step);
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        id, " step ", step, " is not kept; timelines are kept for steps ",
        kept.front().first, " to ", kept.back().first));
  }
  v1::Trace trace;
  trace.set_job_id(id);
  trace.set_job_name(job.info.name());
  trace.set_step(found->first);
  trace.set_schedule(job.info.schedule());
  trace.set_num_ranks(job.plan.num_ranks);
  trace.set_virtual_stages(job.plan.virtual_stages);
  trace.set_microbatches(job.info.microbatches());
  for (const auto& entry : kept) trace.add_available_steps(entry.first);
  for (int r = 0; r < static_cast<int>(found->second.size()); ++r) {
    const v1::StepReport& report = found->second[r];
    v1::RankTrace* rank = trace.add_ranks();
    rank->set_rank(r);
    if (r < job.info.worker_ids_size()) {
      rank->set_worker_id(job.info.worker_ids(r));
      if (const WorkerRecord* w = workers_.Find(job.info.worker_ids(r))) {
        rank->set_worker_name(w->info.name());
      }
    }
    for (const StagePlan& s : job.plan.stages) {
      if (s.rank == r) rank->add_stages(s.stage);
    }
    rank->set_start_unix_us(report.start_unix_us());
    rank->set_seconds(report.seconds());
    *rank->mutable_spans() = report.spans();
  }
  return trace;
}

absl::StatusOr<v1::Job> JobManager::GetJob(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = jobs_.find(JobNumber(id));
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  }
  return it->second.info;
}

std::vector<v1::Job> JobManager::ListJobs() const {
  MutexLock lock(mu_);
  std::vector<v1::Job> out;
  for (const auto& [number, job] : jobs_) out.push_back(job.info);
  return out;
}

absl::StatusOr<v1::Job> JobManager::CancelJob(const std::string& id,
                                              const std::string& reason) {
  // Written ahead: the state file first holds the job as cancelled, and
  // only then is it cancelled here. A cancel the file cannot hold is not
  // applied at all, so what the caller is told, what this coordinator
  // does and what a restarted one would do agree.
  v1::CoordinatorState ahead;
  {
    MutexLock lock(mu_);
    JobRecord* job = FindJob(id);
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
    }
    if (proto::IsTerminal(job->info.state())) return job->info;
    ahead = Snapshot();
    for (v1::JobRecordState& saved : *ahead.mutable_jobs()) {
      if (saved.info().id() != id) continue;
      saved.mutable_info()->set_state(v1::CANCELLED);
      saved.mutable_info()->set_message(reason);
      saved.mutable_info()->set_ended_unix_ms(NowUnixMs());
      saved.mutable_info()->set_queue_position(0);
    }
    auto& queue = *ahead.mutable_queue();
    queue.erase(std::remove(queue.begin(), queue.end(), job->number),
                queue.end());
  }
  if (absl::Status s = SaveState(ahead); !s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        id,
        " was not cancelled: the coordinator could not make the change "
        "durable (it cannot write its state file: ",
        s.message(), "); retry the cancel once it can"));
  }
  v1::Job cancelled;
  {
    MutexLock lock(mu_);
    JobRecord* job = FindJob(id);
    if (job == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
    }
    if (!proto::IsTerminal(job->info.state())) {
      Finish(*job, v1::CANCELLED, reason);
      Schedule();
    }
    cancelled = job->info;
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

absl::StatusOr<std::vector<v1::JobEvent>> JobManager::WaitEvents(
    const std::string& id, int64_t* cursor,
    std::chrono::steady_clock::time_point deadline, bool* done) {
  MutexLock lock(mu_);
  *done = false;
  const uint64_t number = JobNumber(id);
  auto available = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> JobRecord* {
    auto it = jobs_.find(number);
    return it == jobs_.end() ? nullptr : &it->second;
  };
  JobRecord* job = available();
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

// ---------------------------------------------------------------------------
// Time and lifecycle.

void JobManager::Tick() {
  {
    MutexLock lock(mu_);
    if (shutdown_) return;
    TickLocked();
  }
  (void)Persist();  // Logged and reported by StateFileError on failure.
}

void JobManager::DiscountStall(TimePoint now) {
  const std::optional<TimePoint> last = std::exchange(last_tick_, now);
  if (!last.has_value() || options_.stall_threshold.count() <= 0) return;
  const auto gap = now - *last;
  if (gap <= options_.stall_threshold) return;
  // The coordinator did not run for `gap`: the heartbeats sent meanwhile
  // wait unread in their sockets, and the workers may be fine. Judged on the
  // coordinator's own progress, that time is no worker's silence (SIGSTOP
  // of the coordinator for 15 s once failed a job "no heartbeat for 15.1 s"
  // on every worker).
  SPDLOG_WARN(
      "the coordinator did not run for {:.1f} s (a stall, not the workers'): "
      "heartbeat timeouts discount it",
      Seconds(gap));
  // (Not past now: a heartbeat read during the gap, by a thread that did
  // run, is already recent.)
  workers_.DiscountStall(gap, now);
}

void JobManager::TickLocked() {
  const TimePoint now = options_.clock();
  DiscountStall(now);
  for (WorkerRecord* w : workers_.Silent(now, options_.heartbeat_timeout)) {
    MarkLost(*w, absl::StrFormat("no heartbeat for %.1f s (timeout %.1f s)",
                                 Seconds(now - w->last_seen),
                                 Seconds(options_.heartbeat_timeout)));
  }
  for (auto& [number, job] : jobs_) {
    if (job.info.state() == v1::PLANNING && now > job.prepare_deadline) {
      std::vector<std::string> slow;
      for (int r = 0; r < job.info.worker_ids_size(); ++r) {
        if (!job.ranks.is_ready(r)) slow.push_back(job.info.worker_ids(r));
      }
      FailOrRestart(
          job,
          job.profiling
              ? absl::StrFormat(
                    "%s did not report its layer profile within %.0f s",
                    job.info.worker_ids(0), Seconds(options_.prepare_timeout))
              : absl::StrFormat("%s did not report ready within %.0f s",
                                absl::StrJoin(slow, ", "),
                                Seconds(options_.prepare_timeout)),
          "timeout");
    }
    if (job.failing && now >= job.failure_deadline) {
      FailOrRestart(job, job.failure, "rank_failed");
    }
    if (job.draining && job.drain_step == 0 && now > job.drain_deadline &&
        job.info.state() == v1::RUNNING) {
      std::vector<std::string> silent;
      for (int r = 0; r < job.info.worker_ids_size(); ++r) {
        if (!job.drain_points.contains(r) && !job.ranks.ended(r)) {
          silent.push_back(job.info.worker_ids(r));
        }
      }
      FailOrRestart(job,
                    absl::StrFormat("%s did not answer the drain within %.1f s",
                                    absl::StrJoin(silent, ", "),
                                    Seconds(options_.heartbeat_timeout)),
                    "timeout");
    }
  }
  Schedule();
}

void JobManager::Shutdown() {
  (void)Persist();  // Logged on failure; nothing more can be done now.
  MutexLock lock(mu_);
  shutdown_ = true;
  ++event_count_;
  events_cv_.NotifyAll();
}
// ---------------------------------------------------------------------------
// Helpers.

std::string JobManager::MakeSecret() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&out, absl::Hex(rd(), absl::kZeroPad8));
  }
  return out;
}

JobManager::JobRecord& JobManager::AddJobRecord(uint64_t number) {
  return jobs_
      .try_emplace(number, options_.max_events_per_job, options_.trace_steps)
      .first->second;
}

JobManager::JobRecord* JobManager::FindJob(const std::string& id) {
  auto it = jobs_.find(JobNumber(id));
  return it == jobs_.end() ? nullptr : &it->second;
}

std::string JobManager::DescribeWorker(const WorkerRecord& w) const {
  std::string out = absl::StrCat(w.info.id(), " (", w.info.name());
  auto it = jobs_.find(JobNumber(w.info.job_id()));
  if (it != jobs_.end()) {
    const auto& ids = it->second.info.worker_ids();
    const int rank = static_cast<int>(
        std::find(ids.begin(), ids.end(), w.info.id()) - ids.begin());
    absl::StrAppend(&out, ", rank ", rank, ", stages ",
                    absl::StrJoin(w.info.stages(), ","));
  }
  absl::StrAppend(&out, ")");
  return out;
}

void JobManager::UpdateQueuePositions() {
  // Live workers by devices_per_stage, counted once a pass: this runs at
  // every Tick, and the queue may be long and the fleet large.
  std::map<int64_t, int> live;
  int position = 1;
  for (uint64_t number : queue_.order()) {
    JobRecord& job = jobs_.at(number);
    const int64_t devices = job.plan.job.pipeline.devices_per_stage;
    auto [it, added] = live.try_emplace(devices, 0);
    if (added) it->second = workers_.Live(devices);
    job.info.set_queue_position(position);
    job.info.set_queue_reason(WhyQueued(job, position, it->second));
    ++position;
  }
}

std::string JobManager::WhyQueued(JobRecord& job, int position, int live) {
  // A job that waits for workers that are not there says so, whatever its
  // turn: a queue that never moves must not look like one that will.
  const int64_t devices = job.plan.job.pipeline.devices_per_stage;
  const int needed = job.plan.num_ranks;
  const std::string workers = absl::StrCat(
      needed, needed == 1 ? " worker" : " workers",
      devices > 1 ? absl::StrCat(" with ", devices, " devices") : "");
  if (live < needed) {
    return absl::StrCat("needs ", workers, "; ", live,
                        live == 1 ? " is" : " are",
                        " live: it waits for more to register");
  }
  if (position > 1) {
    return absl::StrCat("behind ", position - 1,
                        position == 2 ? " job" : " jobs",
                        " (first come, first served)");
  }
  if (const int idle = static_cast<int>(workers_.Idle(devices).size());
      idle < needed) {
    return absl::StrCat("needs ", workers, " idle; ", idle,
                        idle == 1 ? " is" : " are",
                        " (the others run or finish other jobs)");
  }
  return "";
}

int64_t JobManager::NowUnixMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace conveyor::coordinator
