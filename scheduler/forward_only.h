// Forward-only schedules: what an evaluation runs through a training
// pipeline (job/job_spec.h EvalSpec). Every (stage, microbatch) has its
// forward and nothing else, on the ranks the training schedule's placement
// gives, so the same workers hold the same stages; no activation outlives
// its forward.
//
// Each rank's order is a greedy list schedule at unit cost: at every tick
// each rank runs, of the forwards whose input is ready, the one of the
// lowest microbatch (then stage). A rank thus starts a later chunk of an
// early microbatch as soon as it arrives, so with V virtual stages the
// makespan at unit costs is about M*V + P*V - 1 ticks whatever the
// placement, and the last stage's forwards (where the loss is summed) run
// in microbatch order. The output passes ValidateSchedule, rendezvous sends
// included (property-tested over P in 1..16, M in 1..64, V in 1..4 and both
// placements). Pure functions; thread-safe.
#ifndef CONVEYOR_SCHEDULER_FORWARD_ONLY_H_
#define CONVEYOR_SCHEDULER_FORWARD_ONLY_H_

#include "absl/status/statusor.h"
#include "scheduler/generators.h"
#include "scheduler/schedule.h"

namespace conveyor::scheduler {

// The forward-only schedule of M microbatches over the stages and placement
// a `kind` training schedule with `options` runs (Schedule::forward_only
// set, kind recorded for the placement and the send model).
// InvalidArgument for out-of-range options (P, M, V as GenerateSchedule
// bounds them; V = 2 for the v-placed kinds; V = 1 for kinds without
// virtual stages) or more than kMaxStageMicrobatches forwards.
absl::StatusOr<Schedule> GenerateForwardOnly(ScheduleKind kind,
                                             const ScheduleOptions& options);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_FORWARD_ONLY_H_
