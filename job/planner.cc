#include "job/planner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "job/internal/plan_text.h"
#include "scheduler/forward_only.h"
#include "scheduler/generators.h"
#include "scheduler/validator.h"

namespace conveyor::job {

using job_internal::Bytes;
using job_internal::Reason;

namespace {

absl::Status PipelineError(const JobSpec& job, absl::string_view message) {
  const std::string where = job.pipeline.where.ToString();
  return absl::InvalidArgumentError(
      where.empty() ? absl::StrCat("pipeline: ", message)
                    : absl::StrCat(where, ": pipeline: ", message));
}

absl::Status NumStagesError(const JobSpec& job, absl::string_view message) {
  const std::string where = job.pipeline.num_stages_where.ToString();
  // With schedule: auto the stage count comes from `workers`, where the
  // parser points num_stages_where.
  const absl::string_view key = job.pipeline.auto_schedule
                                    ? "pipeline.workers: "
                                    : "pipeline.num_stages: ";
  return absl::InvalidArgumentError(
      where.empty() ? absl::StrCat(key, message)
                    : absl::StrCat(where, ": ", key, message));
}

// The provisional cut of a stages: auto job: `stages` stages over
// `num_layers` layers with equal layer counts as far as the markers allow.
// Each segment between markers gets one stage, then each further stage goes
// to the segment whose stages are longest.
std::vector<int> ProvisionalCut(int num_layers, int stages,
                                const std::vector<int>& markers) {
  std::vector<int> begin = markers;
  std::vector<int> end(markers.begin() + 1, markers.end());
  end.push_back(num_layers);
  std::vector<int> count(begin.size(), 1);
  for (int extra = stages - static_cast<int>(begin.size()); extra > 0;
       --extra) {
    size_t best = begin.size();
    for (size_t i = 0; i < begin.size(); ++i) {
      const int len = end[i] - begin[i];
      if (count[i] >= len) continue;
      // len / count compared without division.
      if (best == begin.size() ||
          static_cast<int64_t>(len) * count[best] >
              static_cast<int64_t>(end[best] - begin[best]) * count[i]) {
        best = i;
      }
    }
    ++count[best];  // The caller checked stages <= num_layers.
  }
  std::vector<int> cut;
  for (size_t i = 0; i < begin.size(); ++i) {
    const int len = end[i] - begin[i];
    for (int k = 0, at = begin[i]; k < count[i]; ++k) {
      cut.push_back(at);
      at += len / count[i] + (k < len % count[i] ? 1 : 0);
    }
  }
  return cut;
}

// Plans `job` as cut now (job.model's stages).
absl::StatusOr<JobPlan> PlanCut(JobSpec job, StageCut marker_cut) {
  absl::StatusOr<scheduler::ScheduleKind> kind =
      scheduler::ParseScheduleKind(job.pipeline.schedule);
  if (!kind.ok()) return PipelineError(job, kind.status().message());
  const int stages = job.model.num_stages;
  const int64_t v = job.pipeline.virtual_stages;
  if (v < 1 || v > stages) {
    return PipelineError(
        job, absl::StrCat("virtual_stages = ", v, " must be in [1, ", stages,
                          "] (the model has ", stages, " stage(s))"));
  }
  if (stages % v != 0) {
    return PipelineError(
        job, absl::StrCat("the model's ", stages,
                          " stages are not a multiple of virtual_stages = ", v,
                          "; each worker holds virtual_stages stages, so add "
                          "or remove boundary markers"));
  }
  if (v > 1 && !scheduler::TakesVirtualStages(*kind)) {
    return PipelineError(
        job, absl::StrCat(job.pipeline.schedule,
                          " takes no virtual stages (virtual_stages = ", v,
                          "); use interleaved-1f1b, interleaved-zb, zb-v, "
                          "dualpipev, looped-bfs or gpipe, or set "
                          "virtual_stages: 1"));
  }
  if (job.training.microbatches > scheduler::kMaxMicrobatches) {
    return PipelineError(
        job, absl::StrCat("training.microbatches = ", job.training.microbatches,
                          " exceeds the schedule library's limit of ",
                          scheduler::kMaxMicrobatches));
  }
  JobPlan plan;
  plan.marker_cut = std::move(marker_cut);
  plan.virtual_stages = static_cast<int>(v);
  plan.num_stages = stages;
  plan.num_ranks = stages / plan.virtual_stages;
  absl::StatusOr<scheduler::Schedule> schedule = scheduler::GenerateSchedule(
      *kind, {.ranks = plan.num_ranks,
              .microbatches = static_cast<int>(job.training.microbatches),
              .virtual_stages = plan.virtual_stages});
  if (!schedule.ok()) {
    return PipelineError(
        job, absl::StrCat(schedule.status().message(), " (P = ", plan.num_ranks,
                          " workers, M = ", job.training.microbatches,
                          " microbatches)"));
  }
  // Generated schedules are valid by construction; checking costs little
  // next to a job and turns a generator bug into an error, not a hang.
  if (absl::Status valid = scheduler::ValidateSchedule(*schedule);
      !valid.ok()) {
    return absl::InternalError(
        absl::StrCat("generated schedule is invalid: ", valid.message()));
  }
  plan.schedule = *std::move(schedule);
  if (job.eval.enabled) {
    // The parser bounds K * M by the generators' microbatch limit.
    const int64_t count = job.eval.batches * job.training.microbatches;
    absl::StatusOr<scheduler::Schedule> eval = scheduler::GenerateForwardOnly(
        *kind, {.ranks = plan.num_ranks,
                .microbatches = static_cast<int>(count),
                .virtual_stages = plan.virtual_stages});
    if (!eval.ok()) {
      const std::string where = job.eval.where.ToString();
      return absl::InvalidArgumentError(absl::StrCat(
          where.empty() ? "" : absl::StrCat(where, ": "),
          "eval: the evaluation's ", count, " microbatches (batches * ",
          "training.microbatches) cannot be scheduled on ", plan.num_ranks,
          " worker(s): ", eval.status().message()));
    }
    if (absl::Status valid = scheduler::ValidateSchedule(*eval); !valid.ok()) {
      return absl::InternalError(absl::StrCat(
          "generated evaluation schedule is invalid: ", valid.message()));
    }
    plan.eval_schedule = *std::move(eval);
  }
  for (int s = 0; s < stages; ++s) {
    StagePlan sp;
    sp.stage = s;
    sp.rank = plan.schedule.RankOfStage(s);
    sp.first_layer = job.model.stage_begin[s];
    sp.num_layers = job.model.StageEnd(s) - sp.first_layer;
    for (const engine::ParamSpec* p : job.model.StageParams(s)) {
      sp.parameter_names.push_back(p->name);
      sp.num_params += p->NumElements();
    }
    plan.stages.push_back(std::move(sp));
  }
  plan.job = std::move(job);
  return plan;
}

}  // namespace

absl::StatusOr<JobPlan> PlanJob(JobSpec job) {
  if (job.pipeline.auto_schedule && job.pipeline.schedule == "auto") {
    // Provisional until ChooseStages picks: one 1f1b stage a worker.
    job.pipeline.schedule = "1f1b";
    job.pipeline.virtual_stages = 1;
    job.pipeline.num_stages = job.pipeline.workers;
  }
  StageCut markers = StageCut::Of(job.model);
  if (!job.pipeline.auto_stages) return PlanCut(std::move(job), markers);
  const int num_layers = static_cast<int>(job.model.layers.size());
  const int64_t s = job.pipeline.num_stages;
  if (s > num_layers) {
    return NumStagesError(job,
                          absl::StrCat(s, " stages need at least ", s,
                                       " layers; the model has ", num_layers));
  }
  if (s < job.model.num_stages) {
    return NumStagesError(
        job, absl::StrCat(s, " is fewer than the ", job.model.num_stages,
                          " stages the model's boundary markers make; remove "
                          "markers or raise num_stages"));
  }
  ASSIGN_OR_RETURN(
      const StageCut provisional,
      StageCut::Create(ProvisionalCut(num_layers, static_cast<int>(s),
                                      markers.first_layers()),
                       num_layers));
  RETURN_IF_ERROR(provisional.ApplyTo(&job.model));
  return PlanCut(std::move(job), std::move(markers));
}

absl::StatusOr<JobPlan> PlanWithCut(JobSpec job, const StageCut& cut) {
  StageCut markers = StageCut::Of(job.model);
  if (absl::Status s = cut.ApplyTo(&job.model); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage_begin: ", s.message()));
  }
  return PlanCut(std::move(job), std::move(markers));
}

absl::StatusOr<JobSpec> RelayoutOnto(JobSpec job, int ranks) {
  if (job.pipeline.auto_schedule) {
    job.pipeline.workers = ranks;
    return job;
  }
  const int64_t v = job.pipeline.virtual_stages;
  const int64_t stages = ranks * v;
  if (job.pipeline.auto_stages) {
    if (stages > static_cast<int64_t>(job.model.layers.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          stages, " stages (", ranks, " workers x ", v,
          " virtual stages) need at least as many layers; the model has ",
          job.model.layers.size()));
    }
    job.pipeline.num_stages = stages;
    return job;
  }
  const std::vector<int> markers = job.model.stage_begin;
  const int64_t s = static_cast<int64_t>(markers.size());
  const int num_layers = static_cast<int>(job.model.layers.size());
  if (stages > s) {
    return absl::FailedPreconditionError(
        absl::StrCat(ranks, " workers x ", v, " virtual stages need ", stages,
                     " stages; the job's boundary markers make ", s));
  }
  // Group g takes the marked stages [first(g), first(g + 1)).
  std::vector<int> begin;
  for (int64_t g = 0; g < stages; ++g) {
    const int64_t first = g * (s / stages) + std::min(g, s % stages);
    begin.push_back(markers[first]);
  }
  ASSIGN_OR_RETURN(const StageCut merged,
                   StageCut::Create(std::move(begin), num_layers));
  RETURN_IF_ERROR(merged.ApplyTo(&job.model));
  return job;
}

absl::StatusOr<scheduler::StageSearchInput> StageSearchInputFor(
    const JobPlan& plan, const std::vector<engine::LayerProfile>& profile,
    double transfer_seconds) {
  const JobSpec& job = plan.job;
  if (profile.size() != job.model.layers.size()) {
    return PipelineError(
        job, absl::StrCat("the layer profile has ", profile.size(),
                          " entries; the model has ", job.model.layers.size(),
                          " layers"));
  }
  // Each parameter is held with its gradient and the optimizer's state.
  int copies = 2;
  switch (job.optimizer.kind) {
    case engine::OptimizerConfig::Kind::kSgd:
      copies += job.optimizer.momentum > 0 ? 1 : 0;
      break;
    case engine::OptimizerConfig::Kind::kAdam:
    case engine::OptimizerConfig::Kind::kAdamW:
      copies += 2;
      break;
  }
  scheduler::StageSearchInput input;
  for (const engine::LayerProfile& p : profile) {
    input.layers.push_back(
        {.forward = p.forward_seconds,
         .backward_input = p.backward_input_seconds,
         .backward_weight = p.backward_weight_seconds,
         .activation_bytes = static_cast<double>(p.activation_bytes),
         .state_bytes = static_cast<double>(p.parameter_bytes) * copies});
  }
  input.kind = plan.schedule.kind;
  input.ranks = plan.num_ranks;
  input.virtual_stages = plan.virtual_stages;
  input.microbatches = plan.schedule.microbatches;
  input.latency = transfer_seconds;
  if (job.pipeline.memory_budget_bytes > 0) {
    input.memory_budget = job.pipeline.memory_budget_bytes;
  }
  input.fixed_boundaries.assign(plan.marker_cut.first_layers().begin() + 1,
                                plan.marker_cut.first_layers().end());
  return input;
}

namespace {

// schedule: auto: the candidates for `plan`'s workers, each searched.
std::vector<ScheduleCandidate> SearchSchedules(
    const JobPlan& plan, const std::vector<engine::LayerProfile>& profile,
    double transfer_seconds) {
  std::vector<std::pair<scheduler::ScheduleKind, int>> kinds;
  for (scheduler::ScheduleKind kind : scheduler::kAllScheduleKinds) {
    if (kind == scheduler::ScheduleKind::kLoopedBFS) continue;
    if (scheduler::PlacementOf(kind) == scheduler::Placement::kV) {
      kinds.push_back({kind, 2});
    } else if (scheduler::TakesVirtualStages(kind)) {
      for (int v : {1, 2, 4}) kinds.push_back({kind, v});
    } else {
      kinds.push_back({kind, 1});
    }
  }
  // The candidates share one search's work bound, so choosing the schedule
  // too costs the coordinator no more than a stages: auto job does.
  const int64_t work = scheduler::StageSearchInput{}.max_simulated_actions /
                       static_cast<int64_t>(kinds.size());
  std::vector<ScheduleCandidate> candidates;
  for (const auto& [kind, v] : kinds) {
    ScheduleCandidate& c = candidates.emplace_back();
    c.schedule = std::string(scheduler::ScheduleKindName(kind));
    c.virtual_stages = v;
    JobSpec job = plan.job;
    job.pipeline.schedule = c.schedule;
    job.pipeline.virtual_stages = v;
    job.pipeline.num_stages = job.pipeline.workers * v;
    absl::StatusOr<JobPlan> provisional =
        plan.marker_cut.ApplyTo(&job.model).ok()
            ? PlanJob(std::move(job))
            : absl::InternalError("the model's markers do not apply");
    absl::Status refused = provisional.status();
    if (provisional.ok()) {
      absl::StatusOr<scheduler::StageSearchInput> input =
          StageSearchInputFor(*provisional, profile, transfer_seconds);
      refused = input.status();
      if (input.ok()) {
        input->max_simulated_actions = work;
        absl::StatusOr<scheduler::StageSearchResult> search =
            scheduler::SearchStages(*input);
        refused = search.status();
        if (search.ok()) c.search = *std::move(search);
      }
    }
    if (!refused.ok()) {
      c.refused = std::string(refused.message());
      c.smallest_peak = scheduler::SmallestPeakOf(refused);
    }
  }
  return candidates;
}

absl::StatusOr<JobPlan> ChooseSchedule(
    const JobPlan& plan, std::vector<engine::LayerProfile> profile,
    std::string profiled_on, bool from_cache, double transfer_seconds) {
  if (profile.size() != plan.job.model.layers.size()) {
    return StageSearchInputFor(plan, profile).status();
  }
  std::vector<ScheduleCandidate> candidates =
      SearchSchedules(plan, profile, transfer_seconds);
  const ScheduleCandidate* best = nullptr;
  std::optional<double> smallest_peak;
  for (const ScheduleCandidate& c : candidates) {
    if (!c.search.has_value()) {
      if (c.smallest_peak.has_value()) {
        smallest_peak = std::min(smallest_peak.value_or(*c.smallest_peak),
                                 *c.smallest_peak);
      }
      continue;
    }
    if (best == nullptr ||
        c.search->makespan < best->search->makespan * (1 - 1e-9)) {
      best = &c;
    }
  }
  if (best == nullptr) {
    if (smallest_peak.has_value()) {
      const std::string at = plan.job.pipeline.memory_budget_where.ToString();
      return absl::InvalidArgumentError(
          absl::StrCat(at.empty() ? "" : absl::StrCat(at, ": "),
                       "pipeline.memory_budget: no schedule fits ",
                       Bytes(plan.job.pipeline.memory_budget_bytes),
                       " per device on ", plan.job.pipeline.workers,
                       " worker(s); the smallest peak any candidate needs is ",
                       Bytes(*smallest_peak)));
    }
    std::string reasons;
    for (const ScheduleCandidate& c : candidates) {
      absl::StrAppend(&reasons, "; ", c.schedule, " V=", c.virtual_stages, ": ",
                      Reason(c.refused));
    }
    return PipelineError(plan.job,
                         absl::StrCat("schedule: auto found no schedule that "
                                      "can run this job",
                                      reasons));
  }
  JobSpec job = plan.job;
  job.pipeline.schedule = best->schedule;
  job.pipeline.virtual_stages = best->virtual_stages;
  job.pipeline.num_stages =
      static_cast<int64_t>(job.pipeline.workers) * best->virtual_stages;
  ASSIGN_OR_RETURN(const StageCut cut,
                   StageCut::Create(best->search->stage_begin,
                                    static_cast<int>(job.model.layers.size())));
  RETURN_IF_ERROR(cut.ApplyTo(&job.model));
  ASSIGN_OR_RETURN(JobPlan chosen, PlanCut(std::move(job), plan.marker_cut));
  scheduler::StageSearchResult search = *best->search;
  chosen.auto_split = AutoSplitPlan{.profiled_on = std::move(profiled_on),
                                    .from_cache = from_cache,
                                    .profile = std::move(profile),
                                    .search = std::move(search),
                                    .candidates = std::move(candidates)};
  return chosen;
}

}  // namespace

absl::StatusOr<JobPlan> ChooseStages(const JobPlan& plan,
                                     std::vector<engine::LayerProfile> profile,
                                     std::string profiled_on, bool from_cache,
                                     double transfer_seconds) {
  if (plan.job.pipeline.auto_schedule) {
    return ChooseSchedule(plan, std::move(profile), std::move(profiled_on),
                          from_cache, transfer_seconds);
  }
  ASSIGN_OR_RETURN(const scheduler::StageSearchInput input,
                   StageSearchInputFor(plan, profile, transfer_seconds));
  absl::StatusOr<scheduler::StageSearchResult> search =
      scheduler::SearchStages(input);
  if (!search.ok()) {
    // The search names the field it could not satisfy; point at it.
    const absl::string_view message = search.status().message();
    const std::string budget_at =
        plan.job.pipeline.memory_budget_where.ToString();
    if (absl::StartsWith(message, "memory_budget: ") && !budget_at.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(budget_at, ": pipeline.", message));
    }
    return PipelineError(plan.job, message);
  }
  JobSpec job = plan.job;
  ASSIGN_OR_RETURN(const StageCut cut,
                   StageCut::Create(search->stage_begin,
                                    static_cast<int>(job.model.layers.size())));
  RETURN_IF_ERROR(cut.ApplyTo(&job.model));
  ASSIGN_OR_RETURN(JobPlan chosen, PlanCut(std::move(job), plan.marker_cut));
  chosen.auto_split = AutoSplitPlan{.profiled_on = std::move(profiled_on),
                                    .from_cache = from_cache,
                                    .profile = std::move(profile),
                                    .search = *std::move(search)};
  return chosen;
}

std::vector<const StagePlan*> StagesOfRank(const JobPlan& plan, int rank) {
  std::vector<const StagePlan*> out;
  for (const StagePlan& s : plan.stages) {
    if (s.rank == rank) out.push_back(&s);
  }
  return out;
}

}  // namespace conveyor::job
