#include "job/planner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "scheduler/generators.h"
#include "scheduler/validator.h"

namespace conveyor::job {
namespace {

absl::Status PipelineError(const engine::JobSpec& job,
                           absl::string_view message) {
  const std::string where = job.pipeline.where.ToString();
  return absl::InvalidArgumentError(
      where.empty() ? absl::StrCat("pipeline: ", message)
                    : absl::StrCat(where, ": pipeline: ", message));
}

absl::Status NumStagesError(const engine::JobSpec& job,
                            absl::string_view message) {
  const std::string where = job.pipeline.num_stages_where.ToString();
  return absl::InvalidArgumentError(
      where.empty() ? absl::StrCat("pipeline.num_stages: ", message)
                    : absl::StrCat(where, ": pipeline.num_stages: ", message));
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

std::string Bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

std::string DescribeAutoSplit(const JobPlan& plan) {
  const AutoSplitPlan& a = *plan.auto_split;
  const scheduler::StageSearchResult& r = a.search;
  std::string out = absl::StrFormat(
      "stages: auto from a profile on %s%s (microbatch of %d samples); "
      "%s search, %d split(s) simulated\n",
      a.profiled_on, a.from_cache ? " (cached)" : "",
      plan.job.training.microbatch_size(),
      r.exhaustive ? "exhaustive" : "local", r.simulations);
  absl::StrAppendFormat(&out, "%-6s %-6s %-12s %9s %9s %9s %14s\n", "stage",
                        "rank", "layers", "F ms", "BI ms", "BW ms", "memory");
  for (const StagePlan& s : plan.stages) {
    double f = 0, bi = 0, bw = 0;
    // The profile may have been dropped once cached (JobManager).
    for (int i = s.first_layer; i < s.first_layer + s.num_layers &&
                                i < static_cast<int>(a.profile.size());
         ++i) {
      f += a.profile[i].forward_seconds;
      bi += a.profile[i].backward_input_seconds;
      bw += a.profile[i].backward_weight_seconds;
    }
    absl::StrAppendFormat(
        &out, "%-6d %-6d %-12s %9.3f %9.3f %9.3f %14s\n", s.stage, s.rank,
        absl::StrCat(s.first_layer, "-", s.first_layer + s.num_layers - 1),
        f * 1e3, bi * 1e3, bw * 1e3,
        s.stage < static_cast<int>(r.stage_memory.size())
            ? Bytes(r.stage_memory[s.stage])
            : "?");
  }
  double peak = 0;
  for (double m : r.rank_memory) peak = std::max(peak, m);
  absl::StrAppendFormat(
      &out, "predicted step %.3f ms, bubble %.1f%%, peak memory per device %s",
      r.makespan * 1e3, r.bubble_fraction * 100, Bytes(peak));
  if (plan.job.pipeline.memory_budget_bytes > 0) {
    absl::StrAppendFormat(&out, " (budget %s)",
                          Bytes(plan.job.pipeline.memory_budget_bytes));
  }
  out += "\n";
  std::vector<int> even_layers;
  for (size_t i = 0; i < r.even_stage_begin.size(); ++i) {
    const int end = i + 1 < r.even_stage_begin.size()
                        ? r.even_stage_begin[i + 1]
                        : static_cast<int>(plan.job.model.layers.size());
    even_layers.push_back(end - r.even_stage_begin[i]);
  }
  if (r.even_makespan.has_value() && r.makespan > 0) {
    absl::StrAppendFormat(
        &out,
        "even split (%s layers): predicted step %.3f ms; the chosen split is "
        "predicted %.2fx as fast\n",
        absl::StrJoin(even_layers, ","), *r.even_makespan * 1e3,
        *r.even_makespan / r.makespan);
  } else {
    absl::StrAppendFormat(&out,
                          "even split (%s layers): not comparable (it breaks "
                          "a boundary marker or the memory budget)\n",
                          absl::StrJoin(even_layers, ","));
  }
  return out;
}

// Plans `job` as cut now (job.model's stages).
absl::StatusOr<JobPlan> PlanCut(engine::JobSpec job,
                                std::vector<int> marker_stage_begin) {
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
  plan.marker_stage_begin = std::move(marker_stage_begin);
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

absl::StatusOr<JobPlan> PlanJob(engine::JobSpec job) {
  std::vector<int> markers = job.model.stage_begin;
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
  RETURN_IF_ERROR(engine::SetStageBoundaries(
      &job.model, ProvisionalCut(num_layers, static_cast<int>(s), markers)));
  return PlanCut(std::move(job), std::move(markers));
}

absl::StatusOr<JobPlan> PlanWithCut(engine::JobSpec job,
                                    const std::vector<int>& stage_begin) {
  std::vector<int> markers = job.model.stage_begin;
  if (absl::Status s = engine::SetStageBoundaries(&job.model, stage_begin);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage_begin: ", s.message()));
  }
  return PlanCut(std::move(job), std::move(markers));
}

absl::StatusOr<scheduler::StageSearchInput> StageSearchInputFor(
    const JobPlan& plan, const std::vector<engine::LayerProfile>& profile) {
  const engine::JobSpec& job = plan.job;
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
  if (job.pipeline.memory_budget_bytes > 0) {
    input.memory_budget = job.pipeline.memory_budget_bytes;
  }
  input.fixed_boundaries.assign(plan.marker_stage_begin.begin() + 1,
                                plan.marker_stage_begin.end());
  return input;
}

absl::StatusOr<JobPlan> ChooseStages(const JobPlan& plan,
                                     std::vector<engine::LayerProfile> profile,
                                     std::string profiled_on, bool from_cache) {
  ASSIGN_OR_RETURN(const scheduler::StageSearchInput input,
                   StageSearchInputFor(plan, profile));
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
  engine::JobSpec job = plan.job;
  RETURN_IF_ERROR(engine::SetStageBoundaries(&job.model, search->stage_begin));
  ASSIGN_OR_RETURN(JobPlan chosen,
                   PlanCut(std::move(job), plan.marker_stage_begin));
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

std::string DescribePlan(const JobPlan& plan) {
  const engine::JobSpec& job = plan.job;
  std::string out = absl::StrFormat(
      "job %s: %s, %d worker(s) x %d virtual stage(s) = %d stage(s); %d "
      "steps of batch %d in %d microbatches of %d\n",
      job.name, scheduler::ScheduleKindName(plan.schedule.kind), plan.num_ranks,
      plan.virtual_stages, plan.num_stages, job.training.steps,
      job.training.batch_size, job.training.microbatches,
      job.training.microbatch_size());
  absl::StrAppendFormat(&out, "%-6s %-6s %-12s %-40s %12s\n", "stage", "rank",
                        "layers", "kinds", "parameters");
  for (const StagePlan& s : plan.stages) {
    std::string kinds;
    for (int i = s.first_layer; i < s.first_layer + s.num_layers; ++i) {
      if (!kinds.empty()) kinds += ",";
      absl::StrAppend(&kinds, engine::LayerKindName(job.model.layers[i].kind));
    }
    if (kinds.size() > 40) kinds = kinds.substr(0, 37) + "...";
    absl::StrAppendFormat(
        &out, "%-6d %-6d %-12s %-40s %12d\n", s.stage, s.rank,
        absl::StrCat(s.first_layer, "-", s.first_layer + s.num_layers - 1),
        kinds, s.num_params);
  }
  absl::StrAppendFormat(&out, "actions per step: %d over %d rank(s)\n",
                        plan.schedule.TotalActions(), plan.num_ranks);
  if (plan.auto_split.has_value()) {
    out += DescribeAutoSplit(plan);
  } else if (plan.job.pipeline.auto_stages) {
    out +=
        "stages: auto; the cut above is provisional until the layers are "
        "profiled\n";
  }
  return out;
}

}  // namespace conveyor::job
