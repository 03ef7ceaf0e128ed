#include "coordinator/planner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "scheduler/generators.h"
#include "scheduler/validator.h"

namespace conveyor::coordinator {
namespace {

absl::Status PipelineError(const engine::JobSpec& job,
                           absl::string_view message) {
  const std::string where = job.pipeline.where.ToString();
  return absl::InvalidArgumentError(
      where.empty() ? absl::StrCat("pipeline: ", message)
                    : absl::StrCat(where, ": pipeline: ", message));
}

}  // namespace

absl::StatusOr<JobPlan> PlanJob(engine::JobSpec job) {
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
                          "); use interleaved-1f1b or gpipe, or set "
                          "virtual_stages: 1"));
  }
  if (job.training.microbatches > scheduler::kMaxMicrobatches) {
    return PipelineError(
        job, absl::StrCat("training.microbatches = ", job.training.microbatches,
                          " exceeds the schedule library's limit of ",
                          scheduler::kMaxMicrobatches));
  }
  JobPlan plan;
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
    sp.rank = s % plan.num_ranks;
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
      job.training.batch_size / job.training.microbatches);
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
  return out;
}

}  // namespace conveyor::coordinator
