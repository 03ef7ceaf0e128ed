// Planner: turns a parsed job into a pipeline plan without touching any
// worker. It checks what the schedule needs of the job (the schedule name,
// virtual stages against the model's stages, microbatches against the
// schedule's rules), cuts the model at its `boundary` markers into P*V
// stages, places stage s on rank s mod P, and generates and validates the
// schedule's per-rank action lists for one step.
//
// The coordinator plans at submission, so a job it cannot run is rejected
// before anything is allocated; `conveyorctl validate` prints the same plan.
// Errors are InvalidArgument "file:line:col: pipeline...: reason".
// Thread-safe (pure functions).
#ifndef CONVEYOR_COORDINATOR_PLANNER_H_
#define CONVEYOR_COORDINATOR_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/job_spec.h"
#include "scheduler/schedule.h"

namespace conveyor::coordinator {

struct StagePlan {
  int stage = 0;
  int rank = 0;         // stage mod P
  int first_layer = 0;  // Into job.model.layers.
  int num_layers = 0;
  int64_t num_params = 0;
  std::vector<std::string> parameter_names;  // Global names, in build order.
};

struct JobPlan {
  engine::JobSpec job;
  int num_ranks = 1;             // P: workers the job needs.
  int virtual_stages = 1;        // V
  int num_stages = 1;            // P * V == job.model.num_stages
  scheduler::Schedule schedule;  // actions[r]: rank r's step.
  std::vector<StagePlan> stages;
};

// Plans `job`. InvalidArgument at job.pipeline.where for an unknown schedule,
// a stage count that is not a multiple of virtual_stages, virtual stages the
// schedule does not take, or microbatches the schedule cannot split.
absl::StatusOr<JobPlan> PlanJob(engine::JobSpec job);

// The stages of `plan` on rank `rank`, ascending.
std::vector<const StagePlan*> StagesOfRank(const JobPlan& plan, int rank);

// A human-readable description: schedule, P, V, M, and one line per stage
// (rank, layers, parameters), as printed by `conveyorctl validate`.
std::string DescribePlan(const JobPlan& plan);

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_PLANNER_H_
