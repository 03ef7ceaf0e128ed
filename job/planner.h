// Planner: turns a parsed job into a pipeline plan without touching any
// worker. It checks what the schedule needs of the job (the schedule name,
// virtual stages against the model's stages, microbatches against the
// schedule's rules), cuts the model at its `boundary` markers into P*V
// stages, places them on ranks as the schedule's placement says (stage s on
// rank s mod P; zb-v: rank r holds stages r and 2P-1-r), and generates and
// validates the schedule's per-rank action lists for one step.
//
// The coordinator plans at submission, so a job it cannot run is rejected
// before anything is allocated; `conveyorctl validate` prints the same plan.
//
// With `pipeline: {stages: auto, num_stages: S}` the cut is chosen from a
// profile of the layers (engine/profiler.h): PlanJob checks the job and
// makes a provisional cut (equal layer counts, keeping the model's boundary
// markers), and ChooseStages replaces it with the split the stage search
// (scheduler/stage_search.h) predicts to give the shortest step of the
// job's schedule within pipeline.memory_budget. The coordinator profiles on
// the job's first worker; `conveyorctl validate` on the local CPU.
// Errors are InvalidArgument "file:line:col: pipeline...: reason".
// Thread-safe (pure functions).
#ifndef CONVEYOR_JOB_PLANNER_H_
#define CONVEYOR_JOB_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/profiler.h"
#include "job/job_spec.h"
#include "job/stage_cut.h"
#include "scheduler/schedule.h"
#include "scheduler/stage_search.h"

namespace conveyor::job {

struct StagePlan {
  int stage = 0;
  int rank = 0;         // From the schedule's placement.
  int first_layer = 0;  // Into job.model.layers.
  int num_layers = 0;
  int64_t num_params = 0;
  std::vector<std::string> parameter_names;  // Global names, in build order.
};

// One schedule `schedule: auto` considered: its kind, V and, when it can
// run the job, the stage search's best split for it.
struct ScheduleCandidate {
  std::string schedule;  // ScheduleKindName
  int virtual_stages = 1;
  std::optional<scheduler::StageSearchResult> search;
  std::string refused;  // Why not, when `search` is empty.
  // For a candidate no split fits the budget with: the smallest peak memory
  // per device it needs.
  std::optional<double> smallest_peak;
};

// How a `stages: auto` split was chosen.
struct AutoSplitPlan {
  std::string profiled_on;  // The device the profile came from.
  bool from_cache = false;
  // One entry per layer; the coordinator drops it once the job is cut (the
  // profile stays in its cache), leaving DescribePlan's per-stage times 0.
  std::vector<engine::LayerProfile> profile;
  scheduler::StageSearchResult search;
  // schedule: auto only: every candidate, in kAllScheduleKinds order, V
  // ascending; the chosen one's search is `search`.
  std::vector<ScheduleCandidate> candidates = {};
};

struct JobPlan {
  // The job, its model cut into num_stages stages (the provisional or
  // chosen cut for stages: auto).
  JobSpec job;
  // The model's own cut, from its boundary markers (one stage without
  // markers).
  StageCut marker_cut;
  // Set by ChooseStages; for stages: auto, nullopt means the cut is still
  // provisional.
  std::optional<AutoSplitPlan> auto_split;
  int num_ranks = 1;             // P: workers the job needs.
  int virtual_stages = 1;        // V
  int num_stages = 1;            // P * V == job.model.num_stages
  scheduler::Schedule schedule;  // actions[r]: rank r's step.
  // With an eval section: the forward-only schedule of one evaluation, K * M
  // microbatches over the same ranks and placement
  // (scheduler/forward_only.h).
  std::optional<scheduler::Schedule> eval_schedule;
  std::vector<StagePlan> stages;
};

// Plans `job`. InvalidArgument at job.pipeline.where for an unknown schedule,
// a stage count that is not a multiple of virtual_stages, virtual stages the
// schedule does not take, or microbatches the schedule cannot split; with
// stages: auto also, at num_stages, for more stages than layers or fewer
// than the boundary markers make.
absl::StatusOr<JobPlan> PlanJob(JobSpec job);

// Plans a stages: auto (or relaid out) `job` cut at `cut`: the cut the
// coordinator chose, as a worker plans it again. InvalidArgument
// "stage_begin: ..." when the cut is of another number of layers.
absl::StatusOr<JobPlan> PlanWithCut(JobSpec job, const StageCut& cut);

// Elastic restarts: `job` (as parsed from its file) laid out for `ranks`
// workers instead of the number its pipeline section makes, keeping its
// schedule and virtual stages. A markers job's stages are merged in order
// into ranks x V groups of consecutive stages, as even in stage count as
// they go (the first groups take one more); a stages: auto job searches
// ranks x V stages; a schedule: auto job chooses for `ranks` workers.
// FailedPrecondition when the model has fewer stages (markers) or layers
// (auto) than ranks x V.
absl::StatusOr<JobSpec> RelayoutOnto(JobSpec job, int ranks);

// True for a stages: auto plan whose cut ChooseStages has not chosen yet.
inline bool NeedsProfile(const JobPlan& plan) {
  return plan.job.pipeline.auto_stages && !plan.auto_split.has_value();
}

// The stage search's input for `plan`'s job and schedule with `profile`:
// state bytes are parameters, gradients and the optimizer's state tensors;
// the markers are fixed boundaries. InvalidArgument when the profile does
// not have one entry per layer.
// `transfer_seconds` is the time one tensor takes between two ranks
// (SimulationCosts::latency).
absl::StatusOr<scheduler::StageSearchInput> StageSearchInputFor(
    const JobPlan& plan, const std::vector<engine::LayerProfile>& profile,
    double transfer_seconds = 0);

// Re-plans a stages: auto `plan` with the split the stage search chooses
// from `profile`. InvalidArgument (at pipeline.where) for a profile of the
// wrong length or a memory budget that no split fits.
//
// With schedule: auto it chooses the schedule and V with the cut: for the
// job's workers P, every kind (looped-bfs is gpipe's order and left out)
// with every V it takes among 1, 2 and 4 (zb-v and dualpipev: 2) that the
// job can run (enough layers, the microbatch rules) is stage-searched, and
// the shortest predicted step within the budget wins; a tie (relative
// 1e-9) goes to the kind listed first, the simpler schedule. A budget no
// candidate fits fails at memory_budget with the smallest peak any
// candidate needs.
//
// `transfer_seconds`: the time one (small) tensor takes from rank to rank
// where the job will run, which every simulated transfer costs; schedules
// differ in how many transfers their critical path holds, so with layers of
// a millisecond or less this decides between them.
absl::StatusOr<JobPlan> ChooseStages(const JobPlan& plan,
                                     std::vector<engine::LayerProfile> profile,
                                     std::string profiled_on, bool from_cache,
                                     double transfer_seconds = 0);

// The stages of `plan` on rank `rank`, ascending.
std::vector<const StagePlan*> StagesOfRank(const JobPlan& plan, int rank);

// For a schedule: auto plan once chosen, one line: the choice, out of how
// many candidates, and why ("zb-v V=2 of 12 candidates: the shortest
// predicted step, 4.21% shorter than interleaved-zb V=2"); "" otherwise.
std::string ScheduleChoice(const JobPlan& plan);

// A human-readable description: schedule, P, V, M, and one line per stage
// (rank, layers, parameters), as printed by `conveyorctl validate`.
std::string DescribePlan(const JobPlan& plan);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_PLANNER_H_
