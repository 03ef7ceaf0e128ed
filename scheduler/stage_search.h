// Stage search: chooses where to cut a model's L layers into S = P*V
// contiguous pipeline stages so that the simulated step time of a given
// schedule is smallest, within a per-device memory budget.
//
// The partitioner (partitioner.h) minimises the slowest stage; that is not
// the same as the shortest step. A schedule's makespan also depends on where
// the heavy stages sit (the first stage's forwards and the last stage's
// backwards are on the critical path of warm-up and drain) and, for zb-h1, on
// how backward splits into BI and BW. So this file scores each candidate split
// with the simulator's makespan (simulator.h) for the schedule the job runs.
//
// Search: when the number of splits that respect the fixed boundaries is at
// most StageSearchInput::exhaustive_limit, every one is simulated and the
// best returned. Makespans within a relative 1e-12 of the smallest count as
// ties (so float rounding in the sums cannot pick the answer), and ties go to
// the lexicographically largest stage_begin, as the partitioner's "remainder
// to the first stages". Otherwise a local search starts from two seeds, the
// partitioner's min-max split of F + BI + BW (PartitionLayers) and the
// uniform split (PartitionUniform), and moves one free boundary at a time to
// the best position strictly between its neighbours (a tie, as above, moves
// it only to a later position whose makespan is no longer) until a sweep
// over all boundaries moves nothing (at most 100 sweeps; each sweep
// simulates about 2L splits). While no split fits the budget it first lowers
// the amount over budget, then the makespan. With fixed boundaries, the seeds
// share the stages among the segments between fixed boundaries (the fewest
// each segment needs for the best min-max, the rest to the costliest per
// stage) and split each segment with the partitioner. The result is never
// worse than either seed that fits the budget (up to the 1e-12 tie rule).
//
// Memory model, per rank r (device): the sum over r's stages of
// state_bytes (parameters, gradients and optimizer state) plus activation
// bytes times the simulator's peak_inflight[r] (microbatches whose stash r
// holds at once). With V > 1 every stage of the rank is charged the rank's
// peak, an upper bound.
//
// Pure functions; thread-safe.
#ifndef CONVEYOR_SCHEDULER_STAGE_SEARCH_H_
#define CONVEYOR_SCHEDULER_STAGE_SEARCH_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/schedule.h"

namespace conveyor::scheduler {

// One layer's profiled costs for one microbatch.
struct LayerCosts {
  double forward = 0;           // seconds
  double backward_input = 0;    // seconds (BI; the whole backward when not
                                // split is BI + BW)
  double backward_weight = 0;   // seconds (BW)
  double activation_bytes = 0;  // stash held from forward until BW
  double state_bytes = 0;       // parameters + gradients + optimizer state
};

struct StageSearchInput {
  std::vector<LayerCosts> layers;  // L entries, L >= num_stages
  ScheduleKind kind = ScheduleKind::k1F1B;
  int ranks = 1;           // P
  int virtual_stages = 1;  // V; S = P * V stages
  int microbatches = 1;    // M
  // Per transfer between ranks (seconds), as SimulationCosts::latency.
  double latency = 0;
  // Per device (rank); unset: no limit.
  std::optional<double> memory_budget = std::nullopt;
  // Layers where a stage must begin (explicit `boundary` markers), strictly
  // ascending, each in 1..L-1. At most S - 1 of them.
  std::vector<int> fixed_boundaries = {};
  // Exhaustive search when at most this many splits respect the fixed
  // boundaries (see above); >= 0, and 0 always searches locally.
  int64_t exhaustive_limit = 20000;
  // Bounds the work: simulations times the schedule's actions stay within
  // this (>= 1), so a huge model or schedule plans in about a second rather
  // than hours. Exhaustive search needs its whole enumeration within it;
  // local search stops moving boundaries when it runs out (the seeds are
  // always simulated) and returns the best split reached.
  int64_t max_simulated_actions = 50'000'000;
};

struct StageSearchResult {
  // First layer of each stage: S entries, stage_begin[0] == 0, strictly
  // increasing.
  std::vector<int> stage_begin;
  double makespan = 0;         // predicted step time (seconds)
  double bubble_fraction = 0;  // the simulation's
  // Per stage: F + BI + BW of one microbatch, and the stage's memory
  // (state_bytes + activation bytes times its rank's peak in flight).
  std::vector<double> stage_time;
  std::vector<double> stage_memory;
  // Per rank: the memory the model above charges it.
  std::vector<double> rank_memory;
  // The uniform split (layer counts as PartitionUniform) for comparison:
  // its stage_begin and predicted makespan, or nullopt when it breaks a
  // fixed boundary or the memory budget.
  std::vector<int> even_stage_begin;
  std::optional<double> even_makespan;
  bool exhaustive = false;  // every split was simulated
  // How many candidate splits were simulated (the uniform comparison and
  // re-simulating the winner not counted); EvaluateSplit reports 1.
  int64_t simulations = 0;
};

// InvalidArgument, naming the field and the rule, for: no layers, more than
// kMaxPartitionLayers, fewer layers than stages, more than
// kMaxPartitionStages stages, a cost or byte count that is negative or not
// finite (or sums past the double range), a latency that is negative or not
// finite, a bad schedule shape (as GenerateSchedule), fixed boundaries out of
// order, out of range or more than S - 1, a memory budget that is negative or
// not finite, a negative exhaustive_limit, a schedule whose total time is not
// finite (as Simulate), or no split within the budget (the message gives the
// smallest peak rank memory any examined split reaches: exhaustive search
// examines every split, so then it is the smallest budget that works).
absl::StatusOr<StageSearchResult> SearchStages(const StageSearchInput& input);

// For SearchStages' "no split within the budget" error: the smallest peak
// rank memory (bytes) any examined split needs, which the status carries as
// a payload; nullopt for any other status.
std::optional<double> SmallestPeakOf(const absl::Status& status);

// The predicted result of one given split (stage_begin as above), with the
// same memory model and the same even_* comparison; the budget is not
// enforced on the split (exhaustive = false, simulations = 1). The split may
// ignore the fixed boundaries. InvalidArgument for a malformed split (not S
// entries, not starting at 0, not strictly increasing, or past the last
// layer) or for any input SearchStages rejects up front.
absl::StatusOr<StageSearchResult> EvaluateSplit(
    const StageSearchInput& input, const std::vector<int>& stage_begin);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_STAGE_SEARCH_H_
