// Discrete-event simulator for pipeline schedules.
//
// Each rank runs its actions in order; an action starts when the rank is free
// and its inputs have arrived. Sends are asynchronous (the data plane queues
// them, so compute never waits for a send); a tensor crossing ranks arrives
// latency + bytes / bandwidth after its producer ends, and one staying on a
// rank arrives at once. The last stage's loss is folded into its backward.
//
// Time is a template parameter: int64_t gives exact integer arithmetic (the
// closed-form tests rely on it), double serves measured costs. Only these two
// are instantiated. Pure functions; thread-safe.
#ifndef CONVEYOR_SCHEDULER_SIMULATOR_H_
#define CONVEYOR_SCHEDULER_SIMULATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/schedule.h"

namespace conveyor::scheduler {

// Per-stage costs. Each vector holds either one entry per stage or a single
// entry that applies to every stage. `backward` is the full backward (B); when
// it is empty, B costs backward_input + backward_weight. Split schedules (BI,
// BW) need backward_input and backward_weight.
template <typename T>
struct SimulationCosts {
  std::vector<T> forward;
  std::vector<T> backward;
  std::vector<T> backward_input;
  std::vector<T> backward_weight;

  // Communication between ranks. bytes_per_time == 0 means infinitely fast
  // links (only latency counts). activation_bytes is per boundary s -> s+1
  // (num_stages - 1 entries, or one for all); gradients have the same size.
  T latency = 0;
  T bytes_per_time = 0;
  std::vector<T> activation_bytes;

  // Every stage costs F = f and B = b; no communication cost.
  static SimulationCosts Uniform(T f, T b);
  // F = f, BI = bi, BW = bw, and B = bi + bw (backward left empty), on every
  // stage.
  static SimulationCosts UniformSplit(T f, T bi, T bw);
};

template <typename T>
struct ActionTiming {
  T start = 0;
  T end = 0;
};

template <typename T>
struct SimulationResult {
  T makespan = 0;
  std::vector<T> busy;  // Per rank: sum of action durations.
  std::vector<T> idle;  // Per rank: makespan - busy.
  // Per rank: the most microbatches whose forward is done and whose backward
  // is not (B, or BW for a split backward, since BW still needs the stage's
  // stashed inputs). This is the activation stash the rank must hold.
  std::vector<int> peak_inflight;
  // Per rank: the most BIs whose BW has not run yet (0 without split).
  std::vector<int> peak_pending_weight_grads;
  // Parallel to Schedule::actions.
  std::vector<std::vector<ActionTiming<T>>> timings;

  // Total idle over total rank-time: sum(idle) / (P * makespan).
  double bubble_fraction() const;
};

// Simulates `schedule` with `costs`. InvalidArgument when a cost vector has the
// wrong length or a needed cost is missing or negative, when the schedule's
// total time would overflow, or (for int64_t) when a transfer time is not a
// whole number; FailedPrecondition when the schedule
// cannot finish even with asynchronous sends (ValidateSchedule says why).
template <typename T>
absl::StatusOr<SimulationResult<T>> Simulate(const Schedule& schedule,
                                             const SimulationCosts<T>& costs);

extern template absl::StatusOr<SimulationResult<int64_t>> Simulate(
    const Schedule&, const SimulationCosts<int64_t>&);
extern template absl::StatusOr<SimulationResult<double>> Simulate(
    const Schedule&, const SimulationCosts<double>&);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_SIMULATOR_H_
