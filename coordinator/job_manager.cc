// JobManager (coordinator/job_manager.h): the workers' side (registration,
// their messages, loss, drain) and time (Tick). The jobs' side (submission,
// queries, cancellation, watching, restore and the state file) is in
// job_manager_jobs.cc.
#include "coordinator/job_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "coordinator/ids.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

namespace {

// After this many attempts in a row lose a worker before completing a step,
// the job is not restarted again (see MarkLost).
constexpr int kMaxAttemptsLostBeforeAStep = 2;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

// Every method is called by a JobRun or the Placer, with mu_ held: the
// interface cannot name the manager's mutex, so the requirement is stated
// here, where clang checks what each method touches.
class JobManager::RunContext final : public JobRunContext {
 public:
  explicit RunContext(JobManager& manager) : m_(manager) {}

  const JobManagerOptions& options() const override { return m_.options_; }
  WorkerRegistry& workers() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    return m_.workers_;
  }
  JobQueue& queue() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    return m_.queue_;
  }
  void MarkChanged() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    m_.MarkChanged();
  }
  void MarkJobChanged(uint64_t job) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    m_.MarkJobChanged(job);
  }
  void EventAdded(uint64_t job) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    m_.CountEvent(job);
  }
  void UpdateQueuePositions() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    m_.placer_.UpdateQueuePositions();
  }
  void ReleaseWorker(WorkerRecord& w) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    m_.ReleaseWorker(w);
  }
  void MarkLost(WorkerRecord& w, const std::string& observed) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    m_.MarkLost(w, observed);
  }
  std::string DescribeWorker(const WorkerRecord& w) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    return m_.DescribeWorker(w);
  }
  void OnJobEnded(JobRun& run) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    m_.ForgetOldJobs(run);
  }
  bool WriteCommitsOutsideLock(
      uint64_t job, std::shared_ptr<CheckpointCommits> commits) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(m_.mu_) {
    if (!m_.dispatching_) return false;
    m_.commits_to_write_.emplace_back(job, std::move(commits));
    return true;
  }

 private:
  JobManager& m_;
};

JobManager::JobManager(JobManagerOptions options)
    : options_(std::move(options)),
      store_(options_.state_file),
      workers_(options_.version),
      context_(std::make_unique<RunContext>(*this)),
      queue_(options_.aging_per_minute),
      placer_(*context_, jobs_) {}

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
  placer_.Schedule();
  return reply;
}

absl::Status JobManager::HandleWorkerMessage(const std::string& worker_id,
                                             const v1::WorkerMessage& message) {
  bool changed = false;
  std::vector<CommitsToWrite> commits;
  absl::Status status = Dispatch(worker_id, message, &changed, &commits);
  // The checkpoint manifests the message completed, written without the
  // lock (coordinator/checkpoint_commits.h), each applied as it lands.
  for (auto& [number, line] : commits) {
    line->WriteQueued([&, number = number] {
      MutexLock lock(mu_);
      if (auto it = jobs_.find(number); it != jobs_.end()) {
        it->second.ApplyWrittenCommits();
      }
    });
    changed = true;
  }
  // A committed checkpoint or a job's end is on disk before the worker's
  // next message is read, not up to a Tick later. (A failure is logged
  // and reported by StateFileError; the next call retries.) A message that
  // changed no record, such as a heartbeat or a step report, does not wait
  // for another's write: with thousands of workers most messages are
  // those, and they share a few handler threads.
  if (changed) (void)Persist();
  return status;
}

absl::Status JobManager::Dispatch(const std::string& worker_id,
                                  const v1::WorkerMessage& message,
                                  bool* changed,
                                  std::vector<CommitsToWrite>* commits) {
  MutexLock lock(mu_);
  const uint64_t changes_before = changes_;
  dispatching_ = true;
  absl::Status status = DispatchLocked(worker_id, message);
  dispatching_ = false;
  *changed = changes_ != changes_before;
  *commits = std::exchange(commits_to_write_, {});
  return status;
}

absl::Status JobManager::DispatchLocked(const std::string& worker_id,
                                        const v1::WorkerMessage& message) {
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
  // A report names its job; one of a job no longer known is late (it
  // ended and was forgotten): ignored.
  switch (message.kind_case()) {
    case v1::WorkerMessage::kHeartbeat: {
      // A worker that says it is idle while we still count it busy with a
      // finished job has ended that job (its JobEnded was lost or raced the
      // cancel): free it.
      if (w->info.state() == v1::BUSY && message.heartbeat().job_id().empty()) {
        JobRun* job = FindJob(w->info.job_id());
        if (job == nullptr || proto::IsTerminal(job->job().info.state())) {
          ReleaseWorker(*w);
          placer_.Schedule();
        }
      }
      return absl::OkStatus();
    }
    case v1::WorkerMessage::kReady:
      if (JobRun* job = FindJob(message.ready().job_id())) {
        job->OnReady(*w, message.ready());
      }
      return absl::OkStatus();
    case v1::WorkerMessage::kStep:
      if (JobRun* job = FindJob(message.step().job_id())) {
        job->OnStep(*w, message.step());
        NoteProgress(job->job().number);
      }
      return absl::OkStatus();
    case v1::WorkerMessage::kProfile:
      if (JobRun* job = FindJob(message.profile().job_id())) {
        placer_.OnProfile(*job, *w, message.profile());
      }
      return absl::OkStatus();
    case v1::WorkerMessage::kEnded:
      OnEnded(*w, message.ended());
      placer_.Schedule();
      return absl::OkStatus();
    case v1::WorkerMessage::kCheckpoint:
      if (JobRun* job = FindJob(message.checkpoint().job_id())) {
        job->OnCheckpoint(*w, message.checkpoint());
      }
      return absl::OkStatus();
    case v1::WorkerMessage::kDrainPoint:
      if (JobRun* job = FindJob(message.drain_point().job_id())) {
        job->OnDrainPoint(*w, message.drain_point());
      }
      return absl::OkStatus();
    case v1::WorkerMessage::kDrain:
      // The worker's SIGTERM: drain it as conveyorctl drain would.
      // (Its reason reaches logs and events: bounded.)
      StartDrain(*w,
                 absl::StrCat("the worker asked (",
                              message.drain().reason().substr(0, 200), ")"));
      placer_.Schedule();
      return absl::OkStatus();
    case v1::WorkerMessage::kDeregister: {
      // Leaving on purpose: its job (if any) fails or restarts as for a
      // loss, and the registry forgets it rather than listing it LOST.
      SPDLOG_INFO("{} deregisters: {}", DescribeWorker(*w),
                  message.deregister().reason());
      MarkLost(*w, absl::StrCat("deregistered (", message.deregister().reason(),
                                ")"));
      workers_.Erase(worker_id);
      placer_.Schedule();
      return absl::OkStatus();
    }
    case v1::WorkerMessage::kRegister:
      return absl::FailedPreconditionError(
          absl::StrCat(worker_id, " is already registered"));
    default:
      return absl::InvalidArgumentError("empty worker message");
  }
}

void JobManager::OnEnded(WorkerRecord& w, const v1::JobEnded& ended) {
  if (w.info.job_id() != ended.job_id()) return;  // Stale.
  JobRun* job = FindJob(ended.job_id());
  if (job == nullptr) {
    ReleaseWorker(w);
    return;
  }
  job->OnEnded(w, ended);  // Frees `w` first.
}

void JobManager::WorkerDisconnected(const std::string& worker_id,
                                    const std::string& reason) {
  MutexLock lock(mu_);
  WorkerRecord* w = workers_.Find(worker_id);
  if (w == nullptr) return;
  MarkLost(*w, reason);
  placer_.Schedule();
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
  JobRun* run = FindJob(w.info.job_id());
  w.info.clear_job_id();
  w.info.clear_stages();
  w.info.clear_data_endpoint();
  if (run == nullptr) return;
  JobRun::JobRecord& job = run->job();
  // A worker of an earlier attempt, still winding down after a restart,
  // keeps the job's id but is no longer among its workers: its loss ends
  // nothing of the attempt now running.
  const bool in_attempt =
      std::find(job.info.worker_ids().begin(), job.info.worker_ids().end(),
                w.info.id()) != job.info.worker_ids().end();
  if (in_attempt && !proto::IsTerminal(job.info.state())) {
    // A job that kills its workers (a size no check caught, a crash in
    // its layers) must not be restarted onto the rest of the cluster, one
    // attempt after another. A loss before any step, twice in a row, is
    // taken as the job's doing; one alone may be the machine's.
    if (!job.stepped &&
        ++job.attempts_lost_before_a_step >= kMaxAttemptsLostBeforeAStep) {
      job.no_restart = absl::StrCat(
          job.attempts_lost_before_a_step,
          " attempts in a row lost a worker before completing a step, so the "
          "job itself may be what ends them (too large for the machine?); "
          "check the workers' logs, then resubmit");
    }
    run->FailOrRestart(absl::StrCat(who, " lost: ", observed), "worker_lost");
  }
}

// ---------------------------------------------------------------------------
// Drains (the job's side is coordinator/job_run_drain.cc).

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
    placer_.Schedule();
  }
  (void)Persist();
  return out;
}

void JobManager::StartDrain(WorkerRecord& w, const std::string& reason) {
  if (w.info.draining()) return;
  w.info.set_draining(true);
  w.info.set_drain_reason(reason);
  JobRun* run = w.info.state() == v1::BUSY ? FindJob(w.info.job_id()) : nullptr;
  SPDLOG_INFO("draining {}: {}", DescribeWorker(w), reason);
  if (run == nullptr || proto::IsTerminal(run->job().info.state())) {
    LeaveIfDrained(w);
    return;
  }
  const JobRun::JobRecord& job = run->job();
  const auto& ids = job.info.worker_ids();
  if (std::find(ids.begin(), ids.end(), w.info.id()) == ids.end()) {
    return;  // An earlier attempt's worker, still winding down.
  }
  const std::string why =
      absl::StrCat(w.info.id(), " (", w.info.name(), ") is drained: ", reason);
  if (job.info.state() == v1::PLANNING) {
    // Not a step run yet on this attempt: nothing to checkpoint.
    run->Requeue(why, "drained", /*drained=*/true);
    return;
  }
  if (job.plan.job.checkpoint.dir.empty()) {
    // Nothing to resume from elsewhere: the job ends here first.
    SPDLOG_WARN(
        "{}: has no checkpoint.dir, so it runs to its end on {} "
        "before that worker leaves",
        job.info.id(), w.info.id());
    return;
  }
  if (job.info.state() == v1::RUNNING && !job.failing && !job.draining) {
    run->DrainJob(why);
  }
}

void JobManager::LeaveIfDrained(WorkerRecord& w) {
  if (!w.info.draining() || w.left || w.info.state() != v1::IDLE) return;
  w.left = true;
  v1::CoordinatorMessage m;
  m.mutable_leave()->set_reason(w.info.drain_reason());
  w.connection->Send(m);
  SPDLOG_INFO("{} drained: told to leave", w.info.id());
}

void JobManager::ReleaseWorker(WorkerRecord& w) {
  if (w.info.state() != v1::BUSY) return;
  w.info.set_state(v1::IDLE);
  w.info.clear_job_id();
  w.info.clear_stages();
  w.info.clear_data_endpoint();
  LeaveIfDrained(w);
}

std::string JobManager::DescribeWorker(const WorkerRecord& w) const {
  std::string out = absl::StrCat(w.info.id(), " (", w.info.name());
  auto it = jobs_.find(JobNumber(w.info.job_id()));
  if (it != jobs_.end()) {
    const auto& ids = it->second.job().info.worker_ids();
    const int rank = static_cast<int>(
        std::find(ids.begin(), ids.end(), w.info.id()) - ids.begin());
    absl::StrAppend(&out, ", rank ", rank, ", stages ",
                    absl::StrJoin(w.info.stages(), ","));
  }
  absl::StrAppend(&out, ")");
  return out;
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
  for (auto& [number, job] : jobs_) job.CheckDeadlines(now);
  placer_.Schedule();
}

void JobManager::Shutdown() {
  (void)Persist();  // Logged on failure; nothing more can be done now.
  MutexLock lock(mu_);
  shutdown_ = true;
  CountEvent(kEveryJob);
}

void JobManager::CountEvent(uint64_t job) {
  ++event_count_;
  recent_events_.emplace_back(event_count_, job);
  if (recent_events_.size() > kRecentEvents) recent_events_.pop_front();
  events_cv_.NotifyAll();
}

}  // namespace conveyor::coordinator
