#include "coordinator/job_manager.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "coordinator/data_plane_choice.h"
#include "engine/checkpoint_manifest.h"
#include "engine/job_spec.h"
#include "engine/profiler.h"
#include "engine/stage_file.h"
#include "job/rank_program.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

using job::ChooseStages;
using job::JobPlan;
using job::NeedsProfile;
using job::PlanJob;
using job::StagePlan;
using job::StagesOfRank;
namespace {

constexpr absl::string_view kJobPrefix = "job-";

// The number in "<prefix><n>", or 0 when `id` is not of that form.
uint64_t ParseId(absl::string_view id, absl::string_view prefix) {
  if (!absl::ConsumePrefix(&id, prefix)) return 0;
  uint64_t n = 0;
  if (!absl::SimpleAtoi(id, &n)) return 0;
  return n;
}

// 16 random bytes, hex: the data plane's per-job handshake secret. Only the
// job's workers receive it, so a stray or hostile connection to a worker's
// data port cannot join the job.
std::string MakeSecret() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&out, absl::Hex(rd(), absl::kZeroPad8));
  }
  return out;
}

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
  RETURN_IF_ERROR(workers_.CheckRequest(request));
  std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
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
    FailOrRestart(*job, absl::StrCat(who, " lost: ", observed));
  }
}

// ---------------------------------------------------------------------------
// Jobs.

absl::StatusOr<v1::Job> JobManager::SubmitJob(
    const v1::SubmitJobRequest& request) {
  if (static_cast<int64_t>(request.yaml().size()) > engine::kMaxJobFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job file is ", request.yaml().size(),
                     " bytes; the limit is ", engine::kMaxJobFileBytes));
  }
  const std::string file_name =
      request.file_name().empty() ? "job.yaml" : request.file_name();
  absl::StatusOr<engine::JobSpec> spec =
      engine::ParseJobSpec(request.yaml(), file_name, request.base_dir());
  if (!spec.ok()) return spec.status();
  const std::string config_hash = engine::JobConfigHash(request.yaml());
  // Outside the lock: finding the checkpoint reads the filesystem.
  std::optional<ResumePoint> resume;
  if (spec->resume.kind != engine::ResumeSpec::Kind::kNone) {
    absl::StatusOr<ResumePoint> point =
        FindResumePoint(spec->resume, spec->checkpoint.dir, config_hash);
    if (!point.ok()) return point.status();
    if (absl::Status s = AdoptCheckpointCut(*point, *spec); !s.ok()) return s;
    resume = *std::move(point);
  }
  absl::StatusOr<JobPlan> plan = PlanJob(*std::move(spec));
  if (!plan.ok()) return plan.status();
  if (resume.has_value()) {
    if (absl::Status s = CheckResumeFitsPlan(*resume, *plan); !s.ok()) {
      return s;
    }
  }
  const std::string checkpoint_dir = plan->job.checkpoint.dir;
  if (!checkpoint_dir.empty()) {
    if (absl::Status s = CheckNothingNewer(
            checkpoint_dir, resume.has_value() ? resume->step : 0);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = engine::CheckCheckpointDirWritable(checkpoint_dir);
        !s.ok()) {
      return s;
    }
  }

  v1::Job submitted;
  uint64_t change = 0;  // changes_ once the job is recorded.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return absl::UnavailableError("coordinator shutting down");
    const int64_t devices = plan->job.pipeline.devices_per_stage;
    const int live = workers_.Live(devices);
    if (plan->num_ranks > live && devices > 1) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "job '%s' needs %d workers with at least %d devices each "
          "(pipeline.devices_per_stage at %s) but the cluster has %d live "
          "worker(s) with that many; start workers with more devices "
          "(--devices cuda:0,1,...) or lower devices_per_stage",
          plan->job.name, plan->num_ranks, devices,
          plan->job.pipeline.devices_per_stage_where.ToString(), live));
    }
    if (plan->num_ranks > live) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "job '%s' needs %d workers (%d stages, %d per worker) but the "
          "cluster has %d live worker(s); start more workers or use fewer "
          "stages",
          plan->job.name, plan->num_ranks, plan->num_stages,
          plan->virtual_stages, live));
    }
    // Two live jobs writing one directory would overwrite each other's steps.
    for (const auto& [n, other] : jobs_) {
      if (!checkpoint_dir.empty() && !proto::IsTerminal(other.info.state()) &&
          other.info.checkpoint_dir() == checkpoint_dir) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint.dir ", checkpoint_dir, " is in use by ",
                         other.info.id(), " ('", other.info.name(),
                         "'); give this job another checkpoint.dir"));
      }
    }
    if (static_cast<int>(queue_.size()) >= options_.max_queued_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the job queue is full (", options_.max_queued_jobs,
                       " jobs waiting); retry later"));
    }
    const uint64_t number = next_job_++;
    JobRecord& job = AddJobRecord(number);
    job.number = number;
    job.secret = MakeSecret();
    job.request = request;
    job.request.set_file_name(file_name);
    job.plan = *std::move(plan);
    job.config_hash = config_hash;
    job.resume = std::move(resume);
    v1::Job& info = job.info;
    info.set_id(absl::StrCat(kJobPrefix, number));
    info.set_name(job.plan.job.name);
    info.set_created_unix_ms(NowUnixMs());
    DescribePlan(job);
    if (job.resume.has_value()) {
      info.set_steps_done(job.resume->step);
      info.set_resumed_from_step(job.resume->step);
      info.set_resumed_from(job.resume->step_dir);
    }
    info.set_state(v1::QUEUED);
    SPDLOG_INFO("{} '{}' queued: {} over {} worker(s)", info.id(), info.name(),
                info.schedule(), info.num_workers());
    job.durable = false;
    queue_.push_back(number);
    UpdateQueuePositions();
    AddEvent(job, nullptr);
    MarkChanged();
    change = changes_;
    submitted = job.info;
  }
  // Before answering: an acknowledged submission survives a crash. One the
  // state file cannot hold is withdrawn (it was never placed) and refused,
  // or a restart would forget it and give its id to another job. Durable
  // means some write since held it (perhaps a Tick's), whatever this one
  // returned.
  const absl::Status persisted = Persist();
  const bool durable = PersistedThrough(change);
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = jobs_.find(ParseId(submitted.id(), kJobPrefix));
  if (it == jobs_.end()) return submitted;  // Already forgotten (cannot be).
  JobRecord& job = it->second;
  if (!durable) {
    if (job.info.state() == v1::QUEUED) {
      std::erase(queue_, job.number);
      jobs_.erase(it);
      UpdateQueuePositions();
    }
    return absl::UnavailableError(absl::StrCat(
        "the job was not accepted: the coordinator cannot write its state "
        "file (",
        persisted.message(), "); retry once it can"));
  }
  job.durable = true;
  if (options_.observer != nullptr) options_.observer->OnSubmitted(job.info);
  Schedule();
  return submitted;
}

void JobManager::DescribePlan(JobRecord& job) {
  const engine::JobSpec& spec = job.plan.job;
  job.rates.samples_per_step = static_cast<double>(spec.training.batch_size);
  job.rates.tokens_per_sample = 0;
  if (spec.model.token_input) {
    job.rates.tokens_per_sample = 1;
    for (int64_t d : spec.model.input_shape) job.rates.tokens_per_sample *= d;
  }
  v1::Job& info = job.info;
  info.set_steps_total(spec.training.steps);
  info.set_schedule(
      std::string(scheduler::ScheduleKindName(job.plan.schedule.kind)));
  info.set_num_stages(job.plan.num_stages);
  info.set_num_workers(job.plan.num_ranks);
  info.set_virtual_stages(job.plan.virtual_stages);
  info.set_batch_size(spec.training.batch_size);
  info.set_microbatches(static_cast<int32_t>(spec.training.microbatches));
  info.set_devices_per_stage(
      static_cast<int32_t>(spec.pipeline.devices_per_stage));
  info.set_checkpoint_dir(spec.checkpoint.dir);
  info.set_max_restarts(static_cast<int32_t>(spec.restart.max_restarts));
  info.clear_stages();
  for (const StagePlan& s : job.plan.stages) {
    v1::StagePlacement* p = info.add_stages();
    p->set_stage(s.stage);
    p->set_rank(s.rank);
    p->set_first_layer(s.first_layer);
    p->set_num_layers(s.num_layers);
    p->set_num_params(s.num_params);
  }
  info.clear_auto_split();
  if (spec.pipeline.auto_stages) info.mutable_auto_split()->set_chosen(false);
}

absl::StatusOr<v1::Trace> JobManager::GetTrace(const std::string& id,
                                               int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(ParseId(id, kJobPrefix));
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
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(ParseId(id, kJobPrefix));
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  }
  return it->second.info;
}

std::vector<v1::Job> JobManager::ListJobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::Job> out;
  for (const auto& [number, job] : jobs_) out.push_back(job.info);
  return out;
}

absl::StatusOr<v1::Job> JobManager::CancelJob(const std::string& id,
                                              const std::string& reason) {
  v1::Job cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  if (absl::Status s = Persist(); !s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        id, " is cancelled, but the coordinator cannot write its state file (",
        s.message(),
        "), so a restart now would not know it; retry the cancel once it "
        "can"));
  }
  return cancelled;
}

std::vector<v1::Worker> JobManager::ListWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
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
  std::unique_lock<std::mutex> lock(mu_);
  *done = false;
  const uint64_t number = ParseId(id, kJobPrefix);
  auto available = [&]() -> JobRecord* {
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
  events_cv_.wait_until(lock, deadline, [&] {
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
  std::unique_lock<std::mutex> lock(mu_);
  events_cv_.wait_until(lock, deadline, [&] { return event_count_ != seen; });
  return event_count_;
}

// ---------------------------------------------------------------------------
// Scheduling.

void JobManager::Schedule() {
  while (!queue_.empty()) {
    JobRecord& job = jobs_.at(queue_.front());
    if (!job.durable) break;  // Placed once SubmitJob has persisted it.
    // A stage runs data parallel over pipeline.devices_per_stage devices of
    // its worker (engine/mesh_stage.h): only workers with that many serve.
    const int64_t devices = job.plan.job.pipeline.devices_per_stage;
    std::vector<WorkerRecord*> idle = workers_.Idle(devices);
    // Strict FIFO: a later, smaller job does not overtake the head, so a
    // large job cannot starve behind a stream of small ones.
    if (static_cast<int>(idle.size()) < job.plan.num_ranks) break;
    queue_.pop_front();
    idle.resize(job.plan.num_ranks);
    Place(job, idle);
  }
  UpdateQueuePositions();
}

void JobManager::Place(JobRecord& job,
                       const std::vector<WorkerRecord*>& workers) {
  const int p = job.plan.num_ranks;
  job.endpoints.assign(p, "");
  job.ready_reports.assign(p, v1::JobReady());
  job.ended.assign(p, false);
  job.succeeded.assign(p, false);
  job.is_ready.assign(p, false);
  job.ready = 0;
  job.prepare_deadline = options_.clock() + options_.prepare_timeout;
  job.info.clear_worker_ids();
  for (WorkerRecord* w : workers) job.info.add_worker_ids(w->info.id());
  for (v1::StagePlacement& s : *job.info.mutable_stages()) {
    s.set_worker_id(job.info.worker_ids(s.rank()));
  }
  SetState(job, v1::PLANNING);
  SPDLOG_INFO("{} placed on {}", job.info.id(),
              absl::StrJoin(job.info.worker_ids(), ", "));
  for (int r = 0; r < p; ++r) {
    WorkerRecord& w = *workers[r];
    w.info.set_state(v1::BUSY);
    w.info.set_job_id(job.info.id());
    w.info.clear_stages();
    for (const StagePlan* s : StagesOfRank(job.plan, r)) {
      w.info.add_stages(s->stage);
    }
  }
  if (!NeedsProfile(job.plan)) {
    SendPrograms(job);
    return;
  }
  WorkerRecord& first = *workers[0];
  job.profile_device = absl::StrJoin(first.info.devices(), ",");
  job.profile_key = ProfileCache::Key(
      job.profile_device,
      engine::ProfileKey(job.plan.job.model,
                         job.plan.job.training.microbatch_size()));
  if (const auto* cached = profiles_.Find(job.profile_key); cached != nullptr) {
    ApplyProfile(job, *cached, /*from_cache=*/true);
    return;
  }
  job.profiling = true;
  job.profile_requested = true;
  SPDLOG_INFO("{}: profiling its {} layers on {} ({})", job.info.id(),
              job.plan.job.model.layers.size(), first.info.id(),
              job.profile_device);
  v1::CoordinatorMessage m;
  v1::ProfileModel* profile = m.mutable_profile();
  profile->set_job_id(job.info.id());
  profile->set_yaml(job.request.yaml());
  profile->set_file_name(job.request.file_name());
  profile->set_base_dir(job.request.base_dir());
  profile->set_repetitions(options_.profile_repetitions);
  if (!first.connection->Send(m)) {
    MarkLost(first, "its session closed before the profile request was sent");
  }
}

void JobManager::SendPrograms(JobRecord& job) {
  job.programs_sent = true;
  for (int r = 0; r < job.plan.num_ranks; ++r) {
    WorkerRecord* w = workers_.Find(job.info.worker_ids(r));
    if (w == nullptr) continue;  // Cannot happen: workers are never erased.
    v1::CoordinatorMessage m;
    *m.mutable_prepare()->mutable_program() = MakeProgram(job, r);
    if (!w->connection->Send(m)) {
      MarkLost(*w, "its session closed before the program was sent");
      return;
    }
  }
}

void JobManager::ApplyProfile(JobRecord& job,
                              std::vector<engine::LayerProfile> profile,
                              bool from_cache) {
  absl::StatusOr<JobPlan> plan = ChooseStages(job.plan, std::move(profile),
                                              job.profile_device, from_cache);
  if (!plan.ok()) {
    Finish(
        job, v1::FAILED,
        absl::StrCat("choosing the stages failed: ", plan.status().message()));
    return;
  }
  job.plan = *std::move(plan);
  job.profiling = false;
  // The profile is cached (or came from the cache); the job keeps only the
  // search's result.
  job.plan.auto_split->profile.clear();
  job.plan.auto_split->profile.shrink_to_fit();
  const scheduler::StageSearchResult& r = job.plan.auto_split->search;
  for (v1::StagePlacement& p : *job.info.mutable_stages()) {
    const StagePlan& s = job.plan.stages[p.stage()];
    p.set_first_layer(s.first_layer);
    p.set_num_layers(s.num_layers);
    p.set_num_params(s.num_params);
  }
  v1::AutoSplit* split = job.info.mutable_auto_split();
  split->set_chosen(true);
  split->set_profiled_on(job.profile_device);
  split->set_from_cache(from_cache);
  split->set_predicted_step_seconds(r.makespan);
  split->set_predicted_bubble(r.bubble_fraction);
  split->set_predicted_even_step_seconds(r.even_makespan.value_or(0));
  for (double t : r.stage_time) split->add_stage_seconds(t);
  for (double m : r.rank_memory) split->add_rank_memory_bytes(m);
  std::vector<int> layers;
  for (const StagePlan& s : job.plan.stages) layers.push_back(s.num_layers);
  SPDLOG_INFO(
      "{}: stages of {} layers chosen{}; predicted step {:.3f} ms (even "
      "split {:.3f} ms)",
      job.info.id(), absl::StrJoin(layers, ","),
      from_cache ? " from a cached profile" : "", r.makespan * 1e3,
      r.even_makespan.value_or(0) * 1e3);
  AddEvent(job, nullptr);
  SendPrograms(job);
}

void JobManager::OnProfile(WorkerRecord& w, const v1::ModelProfile& profile) {
  JobRecord* job = FindJob(profile.job_id());
  if (job == nullptr || !job->profiling || job->info.state() != v1::PLANNING ||
      w.info.job_id() != profile.job_id() ||
      job->info.worker_ids(0) != w.info.id()) {
    return;  // Late: the job ended meanwhile.
  }
  std::vector<engine::LayerProfile> layers;
  for (const v1::LayerCost& c : profile.layers()) {
    // A profile is input from a peer: a negative or non-finite figure would
    // poison the search, so it fails the job instead.
    const double times[] = {c.forward_seconds(), c.backward_input_seconds(),
                            c.backward_weight_seconds()};
    for (double t : times) {
      if (!std::isfinite(t) || t < 0 || c.activation_bytes() < 0 ||
          c.parameter_bytes() < 0) {
        Finish(*job, v1::FAILED,
               absl::StrCat(DescribeWorker(w),
                            " reported a malformed layer profile"));
        return;
      }
    }
    layers.push_back({.forward_seconds = c.forward_seconds(),
                      .backward_input_seconds = c.backward_input_seconds(),
                      .backward_weight_seconds = c.backward_weight_seconds(),
                      .activation_bytes = c.activation_bytes(),
                      .parameter_bytes = c.parameter_bytes()});
  }
  SPDLOG_INFO("{}: {} profiled {} layers in {:.2f} s", job->info.id(),
              w.info.id(), layers.size(), profile.seconds());
  if (layers.size() == job->plan.job.model.layers.size()) {
    profiles_.Put(job->profile_key, layers);
  }
  ApplyProfile(*job, std::move(layers), /*from_cache=*/false);
}

v1::JobProgram JobManager::MakeProgram(const JobRecord& job, int rank) const {
  job::ProgramContext context{
      .job_id = job.info.id(),
      // Unique per attempt: a restarted job's data plane never accepts a
      // tensor of the attempt before it.
      .job_number = (job.number << 16) | static_cast<uint64_t>(job.attempt),
      .secret = job.secret,
      .yaml = job.request.yaml(),
      .file_name = job.request.file_name(),
      .base_dir = job.request.base_dir(),
      .recv_timeout_ms = options_.recv_timeout.count()};
  if (job.resume.has_value()) {
    context.resume_step = job.resume->step;
    context.resume_dir = job.resume->step_dir;
    context.resume_files = job.resume->files;
  }
  return job::CompileRankProgram(job.plan, rank, context);
}

void JobManager::OnReady(WorkerRecord& w, const v1::JobReady& ready) {
  JobRecord* job = FindJob(ready.job_id());
  if (job == nullptr || job->info.state() != v1::PLANNING ||
      w.info.job_id() != ready.job_id()) {
    return;  // Late: the job ended meanwhile.
  }
  const auto& ids = job->info.worker_ids();
  const int rank = static_cast<int>(
      std::find(ids.begin(), ids.end(), w.info.id()) - ids.begin());
  if (rank >= ids.size() || job->is_ready[rank]) return;
  if (ready.data_endpoint().empty()) {
    Finish(*job, v1::FAILED,
           absl::StrCat(DescribeWorker(w), " reported no data endpoint"));
    return;
  }
  job->is_ready[rank] = true;
  job->endpoints[rank] = ready.data_endpoint();
  job->ready_reports[rank] = ready;
  if (++job->ready < job->plan.num_ranks) return;
  const DataPlaneChoice plane = ChooseDataPlane(job->ready_reports);
  job->info.set_data_plane(plane.description);
  SPDLOG_INFO("{}: tensors over {}", job->info.id(), plane.description);
  v1::CoordinatorMessage m;
  m.mutable_start()->set_job_id(job->info.id());
  m.mutable_start()->set_nccl(plane.nccl);
  for (const std::string& e : job->endpoints) m.mutable_start()->add_peers(e);
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
  info.set_last_step_seconds(s.seconds());
  info.set_samples_per_second(s.samples_per_second());
  info.set_tokens_per_second(s.tokens_per_second());
  AddEvent(*job, &s);
  if (options_.observer != nullptr) options_.observer->OnStep(info, s);
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
  job->ended[rank] = true;
  job->succeeded[rank] = ended.state() == v1::SUCCEEDED;
  if (proto::IsTerminal(job->info.state())) return;
  const bool all_ended = std::all_of(job->ended.begin(), job->ended.end(),
                                     [](bool b) { return b; });
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
      FailOrRestart(*job, job->failure);
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
    }
    job->failure_deadline = options_.clock() + options_.failure_grace;
    // Stop the others now; the job's final state waits for the grace.
    v1::CoordinatorMessage m;
    m.mutable_cancel()->set_job_id(job->info.id());
    m.mutable_cancel()->set_reason(job->failure);
    for (int r = 0; r < ids.size(); ++r) {
      WorkerRecord* peer = workers_.Find(ids[r]);
      if (!job->ended[r] && peer != nullptr &&
          peer->info.job_id() == job->info.id()) {
        peer->connection->Send(m);
      }
    }
  }
  // Every worker has answered, so none was lost: no reason to wait.
  if (all_ended) FailOrRestart(*job, job->failure);
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
  const int64_t step = saved.step();
  const int64_t first = job->resume.has_value() ? job->resume->step : 0;
  if (rank >= ids.size() || step <= first || step > job->info.steps_total()) {
    return;
  }
  std::map<int, v1::StageFile>& files = job->pending_checkpoints[step];
  for (const v1::StageFile& f : saved.files()) {
    // A worker speaks only for its own stages; anything else would let one
    // rank's report stand in for another's missing file.
    if (f.stage() < 0 || f.stage() >= job->plan.num_stages ||
        job->plan.stages[f.stage()].rank != rank) {
      FailOrRestart(*job, absl::StrCat(DescribeWorker(w),
                                       " reported a checkpoint file for stage ",
                                       f.stage(), ", which it does not hold"));
      return;
    }
    files[f.stage()] = f;
  }
  if (static_cast<int>(files.size()) < job->plan.num_stages) return;
  const std::map<int, v1::StageFile> complete = std::move(files);
  job->pending_checkpoints.erase(step);
  CommitCheckpoint(*job, step, complete);
}

void JobManager::CommitCheckpoint(JobRecord& job, int64_t step,
                                  const std::map<int, v1::StageFile>& files) {
  const std::string& dir = job.plan.job.checkpoint.dir;
  const engine::CheckpointManifest manifest = MakeManifest(
      job.plan, job.info.id(), job.config_hash, step, files, NowUnixMs());
  // Under the lock: the manifest is small, and no other commit or resume
  // of this job may interleave with it.
  if (absl::Status written = engine::WriteManifest(dir, manifest);
      !written.ok()) {
    Finish(job, v1::FAILED,
           absl::StrCat("committing the checkpoint of step ", step,
                        " failed: ", written.message()));
    return;
  }
  job.committed = ResumePointOf(manifest, dir);
  job.info.set_last_checkpoint_step(step);
  MarkChanged();
  SPDLOG_INFO("{}: checkpoint of step {} complete in {}", job.info.id(), step,
              engine::StepDirPath(dir, step));
  if (const int64_t keep = job.plan.job.checkpoint.keep_latest; keep > 0) {
    absl::StatusOr<std::vector<int64_t>> removed =
        engine::PruneCheckpoints(dir, static_cast<int>(keep));
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

void JobManager::FailOrRestart(JobRecord& job, const std::string& reason) {
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
  const int live = workers_.Live(job.plan.job.pipeline.devices_per_stage);
  if (live < job.plan.num_ranks) {
    Finish(
        job, v1::FAILED,
        absl::StrCat(reason, "; not restarted: the job needs ",
                     job.plan.num_ranks, " workers and ", live, " are live"));
    return;
  }
  StopWorkers(job, reason);
  PrepareNextAttempt(job, reason);
  // At the head: the job was running, and a restart must not wait behind
  // work submitted after it.
  queue_.push_front(job.number);
  UpdateQueuePositions();
  SetState(job, v1::QUEUED);
  if (options_.observer != nullptr) options_.observer->OnRestarted(job.info);
}

void JobManager::PrepareNextAttempt(JobRecord& job, const std::string& reason) {
  // The next attempt starts from the newest step this job committed, or
  // where the job itself started.
  if (job.committed.has_value()) job.resume = job.committed;
  const int64_t from = job.resume.has_value() ? job.resume->step : 0;
  ++job.attempt;
  job.secret = MakeSecret();
  job.info.clear_worker_ids();
  for (v1::StagePlacement& p : *job.info.mutable_stages()) p.clear_worker_id();
  job.endpoints.clear();
  job.ended.clear();
  job.succeeded.clear();
  job.is_ready.clear();
  job.ready = 0;
  job.failing = false;
  job.failure.clear();
  job.no_restart.clear();
  job.stepped = false;
  job.programs_sent = false;
  job.profiling = false;
  job.profile_requested = false;
  job.steps.ClearPending();
  job.pending_checkpoints.clear();
  v1::Job& info = job.info;
  info.set_restarts(info.restarts() + 1);
  info.set_last_restart_reason(reason);
  info.set_steps_done(from);
  if (job.resume.has_value()) {
    info.set_resumed_from_step(job.resume->step);
    info.set_resumed_from(job.resume->step_dir);
  }
  SPDLOG_WARN("{}: restart {} of {} after: {}; resuming from {}", info.id(),
              info.restarts(), info.max_restarts(), reason,
              from > 0 ? absl::StrCat("step ", from) : "the start");
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
    queue_.erase(std::remove(queue_.begin(), queue_.end(), job.number),
                 queue_.end());
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
  SetState(job, state);
  if (options_.observer != nullptr) options_.observer->OnFinished(job.info);
  // A finished job keeps only its newest events (a watcher that is behind
  // skips older ones, as it would while the job ran), and only the newest
  // max_finished_jobs finished jobs are kept at all, so a coordinator that
  // runs for months does not grow with its history.
  job.events.KeepNewest(options_.events_per_finished_job);
  // Nor does it need its parsed job, action lists, parameter names or YAML
  // (GetTrace still reads the plan's ranks and stages).
  job.plan.job = engine::JobSpec();
  job.plan.schedule.actions.clear();
  job.plan.schedule.actions.shrink_to_fit();
  for (StagePlan& s : job.plan.stages) {
    s.parameter_names.clear();
    s.parameter_names.shrink_to_fit();
  }
  job.request.clear_yaml();
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
        job.ended[r] = true;
      }
    }
  }
  v1::CoordinatorMessage m;
  m.mutable_cancel()->set_job_id(job.info.id());
  m.mutable_cancel()->set_reason(reason);
  const auto& ids = job.info.worker_ids();
  for (int r = 0; r < ids.size(); ++r) {
    WorkerRecord* w = workers_.Find(ids[r]);
    if (!job.ended[r] && w != nullptr && w->info.job_id() == job.info.id() &&
        w->info.state() == v1::BUSY) {
      w->connection->Send(m);
    }
  }
}

void JobManager::SetState(JobRecord& job, v1::JobState state) {
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
  events_cv_.notify_all();
}

void JobManager::ReleaseWorker(WorkerRecord& w) {
  if (w.info.state() != v1::BUSY) return;
  w.info.set_state(v1::IDLE);
  w.info.clear_job_id();
  w.info.clear_stages();
}

// ---------------------------------------------------------------------------
// Time and lifecycle.

void JobManager::Tick() {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
        if (!job.is_ready[r]) slow.push_back(job.info.worker_ids(r));
      }
      FailOrRestart(
          job,
          job.profiling
              ? absl::StrFormat(
                    "%s did not report its layer profile within %.0f s",
                    job.info.worker_ids(0), Seconds(options_.prepare_timeout))
              : absl::StrFormat("%s did not report ready within %.0f s",
                                absl::StrJoin(slow, ", "),
                                Seconds(options_.prepare_timeout)));
    }
    if (job.failing && now >= job.failure_deadline) {
      FailOrRestart(job, job.failure);
    }
  }
  Schedule();
}

void JobManager::Shutdown() {
  (void)Persist();  // Logged on failure; nothing more can be done now.
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  ++event_count_;
  events_cv_.notify_all();
}

// ---------------------------------------------------------------------------
// The state file.

absl::Status JobManager::Persist() {
  if (options_.state_file == nullptr) return absl::OkStatus();
  std::lock_guard<std::mutex> persist(persist_mu_);
  v1::CoordinatorState state;
  uint64_t changes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (changes_ == persisted_changes_) return absl::OkStatus();
    changes = changes_;
    state = Snapshot();
  }
  // Outside mu_: a slow disk delays only the next write, not the workers'
  // reports or the clients' calls.
  const absl::Status saved = options_.state_file->Save(state);
  if (saved.ok()) persisted_changes_ = changes;
  std::lock_guard<std::mutex> health(health_mu_);
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
  std::lock_guard<std::mutex> persist(persist_mu_);
  return persisted_changes_ >= change;
}

std::string JobManager::StateFileError() const {
  std::lock_guard<std::mutex> health(health_mu_);
  return state_file_error_;
}

v1::CoordinatorState JobManager::Snapshot() const {
  v1::CoordinatorState state;
  state.set_version(options_.version);
  state.set_next_job(next_job_);
  for (const auto& [number, job] : jobs_) {
    v1::JobRecordState* saved = state.add_jobs();
    *saved->mutable_info() = job.info;
    *saved->mutable_request() = job.request;
    saved->set_config_hash(job.config_hash);
    if (job.resume.has_value()) *saved->mutable_resume() = ToProto(*job.resume);
    if (job.committed.has_value()) {
      *saved->mutable_committed() = ToProto(*job.committed);
    }
    saved->set_attempt(job.attempt);
  }
  for (uint64_t number : queue_) state.add_queue(number);
  return state;
}

absl::Status JobManager::Replan(JobRecord& job) {
  absl::StatusOr<engine::JobSpec> spec = engine::ParseJobSpec(
      job.request.yaml(), job.request.file_name(), job.request.base_dir());
  if (!spec.ok()) return spec.status();
  if (job.resume.has_value()) {
    RETURN_IF_ERROR(AdoptCheckpointCut(*job.resume, *spec));
  }
  ASSIGN_OR_RETURN(JobPlan plan, PlanJob(*std::move(spec)));
  if (job.resume.has_value()) {
    RETURN_IF_ERROR(CheckResumeFitsPlan(*job.resume, plan));
  }
  job.plan = std::move(plan);
  DescribePlan(job);
  return absl::OkStatus();
}

absl::Status JobManager::Restore(const v1::CoordinatorState& state) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!jobs_.empty() || !workers_.empty()) {
    return absl::FailedPreconditionError(
        "job records can only be restored before any job or worker");
  }
  // First every record, so that a bad file changes nothing.
  for (const v1::JobRecordState& saved : state.jobs()) {
    const uint64_t number = ParseId(saved.info().id(), kJobPrefix);
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
    job.request = saved.request();
    job.config_hash = saved.config_hash();
    job.attempt = saved.attempt();
    if (saved.has_resume()) job.resume = FromProto(saved.resume());
    if (saved.has_committed()) job.committed = FromProto(saved.committed());
    job.secret = MakeSecret();
    // No worker of this coordinator has heard of the job.
    const int ranks = job.info.worker_ids_size();
    job.ended.assign(ranks, true);
    job.succeeded.assign(ranks, false);
    job.is_ready.assign(ranks, false);
    job.endpoints.assign(ranks, "");
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
  std::stable_sort(ended.begin(), ended.end(), [&](uint64_t a, uint64_t b) {
    return jobs_.at(a).info.ended_unix_ms() < jobs_.at(b).info.ended_unix_ms();
  });
  for (uint64_t number : ended) {
    JobRecord& job = jobs_.at(number);
    job.request.clear_yaml();
    AddEvent(job, nullptr);
    finished_jobs_.push_back(number);
  }
  // Each kept job's next event: the job as it is now.
  auto start = [&](JobRecord& job) {
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
    if (!job.info.checkpoint_dir().empty()) {
      engine::ResumeSpec latest;
      latest.kind = engine::ResumeSpec::Kind::kLatest;
      absl::StatusOr<ResumePoint> on_disk =
          FindResumePoint(latest, job.info.checkpoint_dir(), job.config_hash);
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
    if (absl::Status s = Replan(job); !s.ok()) {
      Finish(job, v1::FAILED,
             absl::StrCat(at, "; planning it again failed: ", s.message()));
      continue;
    }
    restarted.push_back(number);
    if (options_.observer != nullptr) options_.observer->OnRestarted(job.info);
  }
  for (uint64_t number : queued) {
    JobRecord& job = jobs_.at(number);
    start(job);
    if (absl::Status s = Replan(job); !s.ok()) {
      Finish(job, v1::FAILED,
             absl::StrCat("the coordinator restarted and planning the job "
                          "again failed: ",
                          s.message()));
      continue;
    }
    queue_.push_back(number);
  }
  // Restarted jobs first, as a restart after a lost worker would be.
  queue_.insert(queue_.begin(), restarted.begin(), restarted.end());
  for (uint64_t number : restarted) SetState(jobs_.at(number), v1::QUEUED);
  UpdateQueuePositions();
  SPDLOG_INFO(
      "restored {} job record(s): {} ended, {} queued, {} restarted after "
      "the coordinator's restart",
      jobs_.size(), ended.size(), queue_.size() - restarted.size(),
      restarted.size());
  // The outcomes decided here (FAILED, restarted) are records too.
  MarkChanged();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Helpers.

JobManager::JobRecord& JobManager::AddJobRecord(uint64_t number) {
  return jobs_
      .try_emplace(number, options_.max_events_per_job, options_.trace_steps)
      .first->second;
}

JobManager::JobRecord* JobManager::FindJob(const std::string& id) {
  auto it = jobs_.find(ParseId(id, kJobPrefix));
  return it == jobs_.end() ? nullptr : &it->second;
}

std::string JobManager::DescribeWorker(const WorkerRecord& w) const {
  std::string out = absl::StrCat(w.info.id(), " (", w.info.name());
  auto it = jobs_.find(ParseId(w.info.job_id(), kJobPrefix));
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
  int position = 1;
  for (uint64_t number : queue_) {
    jobs_.at(number).info.set_queue_position(position++);
  }
}

int64_t JobManager::NowUnixMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace conveyor::coordinator
