// JSON form of a schedule and of its simulation, as the CLI prints it:
//
//   {"kind": "1f1b", "ranks": P, "virtual": V, "microbatches": M,
//    "placement": "loop",
//    "schedule": [{"rank": r, "actions": [{"op": "F", "stage": s,
//                                          "microbatch": j}, ...]}, ...],
//    "simulation": {"makespan": ..., "bubble_fraction": ...,
//                   "peak_inflight": [...], ...}}
//
// ScheduleToJson writes everything but "simulation", which SimulationToJson
// produces for the caller to attach. ScheduleFromJson reads the schedule part
// back, so a person can hand-edit a schedule and feed it to the validator or
// the simulator. Readers must ignore keys they do not know: the shape may grow.
// Pure functions; thread-safe.
#ifndef CONVEYOR_SCHEDULER_RENDER_JSON_H_
#define CONVEYOR_SCHEDULER_RENDER_JSON_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace conveyor::scheduler {

// {"kind", "ranks", "virtual", "microbatches", "placement", "schedule"} as
// above; ops are OpName, kind is ScheduleKindName, placement PlacementName.
nlohmann::json ScheduleToJson(const Schedule& schedule);

// {"makespan", "bubble_fraction", "peak_inflight", "busy", "idle",
//  "peak_pending_weight_grads"}: the scalars of `result` and its per-rank
// vectors (one entry per rank). Times keep their type: integers for int64_t,
// floating point for double. Per-action timings are left out; they are as
// large as the schedule and RenderSvg is the way to look at them.
template <typename T>
nlohmann::json SimulationToJson(const SimulationResult<T>& result);

extern template nlohmann::json SimulationToJson(
    const SimulationResult<int64_t>&);
extern template nlohmann::json SimulationToJson(
    const SimulationResult<double>&);

// Reads the shape ScheduleToJson writes; "placement" is optional (default: the
// kind's, PlacementOf). Checks structure only: required keys,
// their types, "schedule" having one entry per rank (each rank exactly once,
// in any order), counts >= 1 and stages and microbatches >= 0. It does not
// check that the schedule makes sense (stages in range, every microbatch run,
// dependencies satisfiable): a hand-made broken schedule loads, so that
// ValidateSchedule can reject it with a reason. Unknown keys are ignored.
//
// Returns InvalidArgument naming the offending location and the problem, e.g.
// "schedule[1].actions[3].op: unknown op 'X'; allowed: F, B, BI, BW". Never
// throws.
absl::StatusOr<Schedule> ScheduleFromJson(const nlohmann::json& root);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_RENDER_JSON_H_
