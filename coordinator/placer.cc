#include "coordinator/placer.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "job/job_spec.h"
#include "job/planner.h"
#include "job/rank_program.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {

using job::ChooseStages;
using job::JobPlan;
using job::NeedsProfile;
using job::StagePlan;
using job::StagesOfRank;

Placer::Placer(JobRunContext& context, std::map<uint64_t, JobRun>& jobs)
    : ctx_(context),
      jobs_(jobs),
      profiles_(context.options().max_cached_profiles) {}

void Placer::Schedule() {
  ReexamineRestarts();
  JobQueue& queue = ctx_.queue();
  queue.Reorder(ctx_.options().clock());
  std::map<std::string, int> held = HeldByOwner();
  // A copy: placing a job takes it out of the queue, and a failed
  // placement may end others.
  const std::vector<uint64_t> order(queue.order().begin(), queue.order().end());
  JobRun* blocked = nullptr;
  for (const uint64_t number : order) {
    if (!queue.contains(number)) continue;  // Ended meanwhile.
    JobRun& run = jobs_.at(number);
    // Placed once SubmitJob has persisted it; until then it keeps its
    // turn.
    if (!run.job().durable) break;
    // Waits for its owner's own jobs, not the cluster's: others pass.
    if (OverQuota(run, held).has_value()) continue;
    // A stage runs data parallel over pipeline.devices_per_stage devices of
    // its worker (engine/mesh_stage.h): only workers with that many serve.
    const JobPlan& plan = run.job().plan;
    const int64_t devices = plan.job.pipeline.devices_per_stage;
    std::vector<WorkerRecord*> idle = ctx_.workers().Idle(devices);
    // All or nothing, and no backfill: a later, smaller job does not
    // overtake this one, so a large job cannot starve behind a stream of
    // small ones.
    if (static_cast<int>(idle.size()) < plan.num_ranks) {
      blocked = &run;
      break;
    }
    run.job().info.set_queued_wait_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(
            queue.Waited(number))
            .count());
    queue.Remove(number);
    idle.resize(plan.num_ranks);
    if (!run.job().info.owner().empty()) {
      held[run.job().info.owner()] += plan.num_ranks;
    }
    Place(run, idle);
  }
  if (blocked != nullptr && ctx_.options().preemption) Preempt(*blocked);
  UpdateQueuePositions();
}

void Placer::ReexamineRestarts() {
  // A copy: Finish takes jobs out of the queue.
  const std::vector<uint64_t> queued(ctx_.queue().order().begin(),
                                     ctx_.queue().order().end());
  for (const uint64_t number : queued) jobs_.at(number).ReexamineRestart();
}

void Placer::Place(JobRun& run, const std::vector<WorkerRecord*>& workers) {
  JobRun::JobRecord& job = run.job();
  const JobManagerOptions& options = ctx_.options();
  const int p = job.plan.num_ranks;
  job.ranks.Start(p);
  job.restart_reason.clear();
  job.info.clear_queue_reason();
  job.prepare_deadline = options.clock() + options.prepare_timeout;
  job.info.clear_worker_ids();
  for (WorkerRecord* w : workers) job.info.add_worker_ids(w->info.id());
  // The MFU's denominator comes with the ranks' JobReady (OnReady).
  job.rates.peak_flops = 0;
  for (v1::StagePlacement& s : *job.info.mutable_stages()) {
    s.set_worker_id(job.info.worker_ids(s.rank()));
  }
  run.SetState(v1::PLANNING);
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
    SendPrograms(run);
    return;
  }
  WorkerRecord& first = *workers[0];
  job.profile_device = absl::StrJoin(first.info.devices(), ",");
  job.profile_key = ProfileCache::Key(
      job.profile_device,
      engine::ProfileKey(job.plan.job.model,
                         job.plan.job.training.microbatch_size()));
  if (const auto* cached = profiles_.Find(job.profile_key); cached != nullptr) {
    ApplyProfile(run, *cached, /*from_cache=*/true);
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
  profile->set_repetitions(options.profile_repetitions);
  if (!first.connection->Send(m)) {
    ctx_.MarkLost(first,
                  "its session closed before the profile request was sent");
  }
}

void Placer::SendPrograms(JobRun& run) {
  JobRun::JobRecord& job = run.job();
  job.programs_sent = true;
  run.RecordLayout();
  std::vector<int> stage_ranks;
  for (const StagePlan& s : job.plan.stages) stage_ranks.push_back(s.rank);
  job.checkpoints.Start(std::move(stage_ranks),
                        job.resume.has_value() ? job.resume->step : 0,
                        job.info.steps_total());
  for (int r = 0; r < job.plan.num_ranks; ++r) {
    WorkerRecord* w = ctx_.workers().Find(job.info.worker_ids(r));
    if (w == nullptr) continue;  // Cannot happen: workers are never erased.
    v1::CoordinatorMessage m;
    *m.mutable_prepare()->mutable_program() = MakeProgram(run, r);
    if (!w->connection->Send(m)) {
      ctx_.MarkLost(*w, "its session closed before the program was sent");
      return;
    }
  }
}

void Placer::ApplyProfile(JobRun& run,
                          std::vector<engine::LayerProfile> profile,
                          bool from_cache) {
  JobRun::JobRecord& job = run.job();
  const auto transfer = transfer_seconds_.find(job.profile_device);
  absl::StatusOr<JobPlan> plan = ChooseStages(
      job.plan, std::move(profile), job.profile_device, from_cache,
      transfer == transfer_seconds_.end() ? 0.0 : transfer->second);
  if (!plan.ok()) {
    run.Finish(v1::FAILED, absl::StrCat("choosing the stages failed: ",
                                        plan.status().message()));
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
  run.DescribePlan();
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
  run.AddEvent(nullptr);
  SendPrograms(run);
}

void Placer::OnProfile(JobRun& run, WorkerRecord& w,
                       const v1::ModelProfile& profile) {
  JobRun::JobRecord& job = run.job();
  if (!job.profiling || job.info.state() != v1::PLANNING ||
      w.info.job_id() != profile.job_id() ||
      job.info.worker_ids(0) != w.info.id()) {
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
        run.Finish(v1::FAILED,
                   absl::StrCat(ctx_.DescribeWorker(w),
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
  SPDLOG_INFO("{}: {} profiled {} layers in {:.2f} s", job.info.id(),
              w.info.id(), layers.size(), profile.seconds());
  if (layers.size() == job.plan.job.model.layers.size()) {
    profiles_.Put(job.profile_key, layers);
  }
  if (std::isfinite(profile.transfer_seconds()) &&
      profile.transfer_seconds() > 0 && profile.transfer_seconds() < 1) {
    // Per device description, so a cached profile finds it too; bounded
    // like the cache, whatever names workers register with.
    if (transfer_seconds_.size() >= 1024) transfer_seconds_.clear();
    transfer_seconds_[job.profile_device] = profile.transfer_seconds();
  }
  ApplyProfile(run, std::move(layers), /*from_cache=*/false);
}

v1::JobProgram Placer::MakeProgram(const JobRun& run, int rank) const {
  const JobRun::JobRecord& job = run.job();
  job::ProgramContext context{
      .job_id = job.info.id(),
      // Unique per attempt: a restarted job's data plane never accepts a
      // tensor of the attempt before it.
      .job_number = (job.number << 16) | static_cast<uint64_t>(job.attempt),
      .secret = job.secret,
      .yaml = job.parsed.yaml,
      .file_name = job.parsed.file_name,
      .base_dir = job.parsed.base_dir,
      .recv_timeout_ms = ctx_.options().recv_timeout.count()};
  if (job.resume.has_value()) {
    context.resume_step = job.resume->step;
    context.resume_dir = job.resume->step_dir;
    context.resume_files = job.resume->files;
    context.resume_stage_begin = job.resume->stage_begin;
  }
  context.relayout = job.relayout_ranks > 0;
  return job::CompileRankProgram(job.plan, rank, context);
}

void Placer::UpdateQueuePositions() {
  // Live and idle workers by devices_per_stage, counted once a pass: this
  // runs at every Tick, and the queue may be long and the fleet large.
  std::map<int64_t, std::pair<int, int>> counts;
  const std::map<std::string, int> held = HeldByOwner();
  const JobQueue& queue = ctx_.queue();
  const JobRun* blocked = nullptr;
  int position = 1;
  for (uint64_t number : queue.order()) {
    JobRun& run = jobs_.at(number);
    v1::Job& info = run.job().info;
    const int64_t devices = run.job().plan.job.pipeline.devices_per_stage;
    auto [it, added] = counts.try_emplace(devices, 0, 0);
    if (added) {
      it->second = {ctx_.workers().Live(devices),
                    static_cast<int>(ctx_.workers().Idle(devices).size())};
    }
    info.set_queue_position(position);
    info.set_effective_priority(queue.EffectivePriority(number));
    info.set_queued_wait_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(
            queue.Waited(number))
            .count());
    info.set_queue_reason(
        WhyQueued(run, it->second.first, it->second.second, blocked, held));
    // The first job that waits for workers holds up those behind it (see
    // Schedule); one over its owner's quota does not.
    if (blocked == nullptr && !OverQuota(run, held).has_value() &&
        it->second.second < run.job().plan.num_ranks) {
      blocked = &run;
    }
    ++position;
  }
}

}  // namespace conveyor::coordinator
