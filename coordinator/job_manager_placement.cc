// JobManager, continued: submission, the queue, placement, profiles and
// programs (coordinator/job_manager.h). One class, one mutex; its files by
// concern.
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/directory.h"
#include "common/printable.h"
#include "common/status_macros.h"
#include "coordinator/ids.h"
#include "coordinator/job_manager.h"
#include "engine/profiler.h"
#include "job/job_spec.h"
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

// ---------------------------------------------------------------------------
// Jobs.

absl::StatusOr<v1::Job> JobManager::SubmitJob(
    const v1::SubmitJobRequest& request) {
  if (static_cast<int64_t>(request.yaml().size()) > job::kMaxJobFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job file is ", request.yaml().size(),
                     " bytes; the limit is ", job::kMaxJobFileBytes));
  }
  const std::string file_name =
      request.file_name().empty() ? "job.yaml" : request.file_name();
  absl::StatusOr<job::ParsedJob> parsed =
      job::ParseJob(request.yaml(), file_name, request.base_dir());
  if (!parsed.ok()) return parsed.status();
  // The plan's copy: a checkpoint's cut changes it, never the parsed file.
  job::JobSpec spec = parsed->spec;
  // Outside the lock: finding the checkpoint reads the filesystem.
  std::optional<checkpoint::ResumePoint> resume;
  if (spec.resume.kind != job::ResumeSpec::Kind::kNone) {
    absl::StatusOr<checkpoint::ResumePoint> point = checkpoint::FindResumePoint(
        spec.resume, spec.checkpoint.dir, parsed->config_hash,
        parsed->training_hash, parsed->yaml);
    if (!point.ok()) return point.status();
    for (const std::string& note : point->notes) {
      SPDLOG_INFO("'{}' resumes from {}: {}", Printable(spec.name),
                  point->step_dir, note);
    }
    if (absl::Status s = checkpoint::AdoptCheckpointCut(*point, spec); !s.ok())
      return s;
    resume = *std::move(point);
  }
  absl::StatusOr<JobPlan> plan = PlanJob(std::move(spec));
  if (!plan.ok()) return plan.status();
  if (resume.has_value()) {
    if (absl::Status s = checkpoint::CheckResumeFitsPlan(*resume, *plan);
        !s.ok()) {
      return s;
    }
  }
  const std::string checkpoint_dir = plan->job.checkpoint.dir;
  if (!checkpoint_dir.empty()) {
    if (absl::Status s = checkpoint::CheckNothingNewer(
            checkpoint_dir, resume.has_value() ? resume->step : 0);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = checkpoint::CheckCheckpointDirWritable(checkpoint_dir);
        !s.ok()) {
      return s;
    }
  }

  v1::Job submitted;
  uint64_t change = 0;  // changes_ once the job is recorded.
  {
    MutexLock lock(mu_);
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
    if (queue_.size() >= options_.max_queued_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the job queue is full (", options_.max_queued_jobs,
                       " jobs waiting); retry later"));
    }
    const uint64_t number = next_job_++;
    JobRecord& job = AddJobRecord(number);
    job.number = number;
    job.secret = MakeSecret();
    job.parsed = *std::move(parsed);
    job.plan = *std::move(plan);
    job.file_ranks = job.plan.num_ranks;
    job.resume = std::move(resume);
    v1::Job& info = job.info;
    info.set_id(JobId(number));
    info.set_name(job.plan.job.name);
    info.set_created_unix_ms(NowUnixMs());
    DescribePlan(job);
    if (job.resume.has_value()) {
      info.set_steps_done(job.resume->step);
      info.set_resumed_from_step(job.resume->step);
      info.set_resumed_from(job.resume->step_dir);
      for (const std::string& note : job.resume->notes) {
        info.add_resume_notes(note);
      }
    }
    info.set_state(v1::QUEUED);
    SPDLOG_INFO("{} '{}' queued: {} over {} worker(s)", info.id(),
                Printable(info.name()), info.schedule(), info.num_workers());
    job.durable = false;
    queue_.Add(number);
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
  MutexLock lock(mu_);
  const auto it = jobs_.find(JobNumber(submitted.id()));
  if (it == jobs_.end()) return submitted;  // Already forgotten (cannot be).
  JobRecord& job = it->second;
  if (!durable) {
    if (job.info.state() == v1::QUEUED) {
      queue_.Remove(job.number);
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
  const job::JobSpec& spec = job.plan.job;
  job.rates.samples_per_step = static_cast<double>(spec.training.batch_size);
  job.rates.tokens_per_sample = 0;
  if (spec.model.token_input) {
    job.rates.tokens_per_sample = 1;
    for (int64_t d : spec.model.input_shape) job.rates.tokens_per_sample *= d;
  }
  job.rates.flops_per_sample = spec.model.TrainingFlopsPerSample();
  v1::Job& info = job.info;
  info.set_steps_total(spec.training.steps);
  info.set_checkpoint_every(
      spec.checkpoint.dir.empty() ? 0 : spec.checkpoint.every);
  // schedule: auto stays "auto" until ChooseStages picks (the provisional
  // plan's 1f1b is nobody's choice).
  info.set_schedule(
      job::NeedsProfile(job.plan) && spec.pipeline.auto_schedule
          ? std::string("auto")
          : std::string(scheduler::ScheduleKindName(job.plan.schedule.kind)));
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
  if (spec.pipeline.auto_stages) {
    info.mutable_auto_split()->set_chosen(false);
    info.mutable_auto_split()->set_schedule_auto(spec.pipeline.auto_schedule);
  }
}

// ---------------------------------------------------------------------------
// Scheduling.

void JobManager::Schedule() {
  ReexamineRestarts();
  while (!queue_.empty()) {
    JobRecord& job = jobs_.at(*queue_.head());
    if (!job.durable) break;  // Placed once SubmitJob has persisted it.
    // A stage runs data parallel over pipeline.devices_per_stage devices of
    // its worker (engine/mesh_stage.h): only workers with that many serve.
    const int64_t devices = job.plan.job.pipeline.devices_per_stage;
    std::vector<WorkerRecord*> idle = workers_.Idle(devices);
    // Strict FIFO: a later, smaller job does not overtake the head, so a
    // large job cannot starve behind a stream of small ones.
    if (static_cast<int>(idle.size()) < job.plan.num_ranks) break;
    queue_.PopHead();
    idle.resize(job.plan.num_ranks);
    Place(job, idle);
  }
  UpdateQueuePositions();
}

void JobManager::Place(JobRecord& job,
                       const std::vector<WorkerRecord*>& workers) {
  const int p = job.plan.num_ranks;
  job.ranks.Start(p);
  job.restart_reason.clear();
  job.info.clear_queue_reason();
  job.prepare_deadline = options_.clock() + options_.prepare_timeout;
  job.info.clear_worker_ids();
  for (WorkerRecord* w : workers) job.info.add_worker_ids(w->info.id());
  // The MFU's denominator comes with the ranks' JobReady (OnReady).
  job.rates.peak_flops = 0;
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
    w.info.clear_data_endpoint();
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
  profile->set_yaml(job.parsed.yaml);
  profile->set_file_name(job.parsed.file_name);
  profile->set_base_dir(job.parsed.base_dir);
  profile->set_repetitions(options_.profile_repetitions);
  if (!first.connection->Send(m)) {
    MarkLost(first, "its session closed before the profile request was sent");
  }
}

void JobManager::SendPrograms(JobRecord& job) {
  job.programs_sent = true;
  RecordLayout(job);
  std::vector<int> stage_ranks;
  for (const StagePlan& s : job.plan.stages) stage_ranks.push_back(s.rank);
  job.checkpoints.Start(std::move(stage_ranks),
                        job.resume.has_value() ? job.resume->step : 0,
                        job.info.steps_total());
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
  const auto transfer = transfer_seconds_.find(job.profile_device);
  absl::StatusOr<JobPlan> plan = ChooseStages(
      job.plan, std::move(profile), job.profile_device, from_cache,
      transfer == transfer_seconds_.end() ? 0.0 : transfer->second);
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
  // The cut (and with schedule: auto the schedule, V and stage count) is
  // new; the ranks keep their workers.
  std::map<int, std::string> worker_of_rank;
  for (const v1::StagePlacement& p : job.info.stages()) {
    worker_of_rank[p.rank()] = p.worker_id();
  }
  DescribePlan(job);
  for (v1::StagePlacement& p : *job.info.mutable_stages()) {
    p.set_worker_id(worker_of_rank[p.rank()]);
  }
  v1::AutoSplit* split = job.info.mutable_auto_split();
  split->set_schedule_auto(job.plan.job.pipeline.auto_schedule);
  split->set_schedule_choice(job::ScheduleChoice(job.plan));
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
  if (std::isfinite(profile.transfer_seconds()) &&
      profile.transfer_seconds() > 0 && profile.transfer_seconds() < 1) {
    // Per device description, so a cached profile finds it too; bounded
    // like the cache, whatever names workers register with.
    if (transfer_seconds_.size() >= 1024) transfer_seconds_.clear();
    transfer_seconds_[job->profile_device] = profile.transfer_seconds();
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
      .yaml = job.parsed.yaml,
      .file_name = job.parsed.file_name,
      .base_dir = job.parsed.base_dir,
      .recv_timeout_ms = options_.recv_timeout.count()};
  if (job.resume.has_value()) {
    context.resume_step = job.resume->step;
    context.resume_dir = job.resume->step_dir;
    context.resume_files = job.resume->files;
    context.resume_stage_begin = job.resume->stage_begin;
  }
  context.relayout = job.relayout_ranks > 0;
  return job::CompileRankProgram(job.plan, rank, context);
}

}  // namespace conveyor::coordinator
