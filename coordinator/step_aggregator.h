// StepAggregator: a job's per-rank step reports, combined into one
// StepSummary once every rank has reported a step, and the newest steps'
// reports kept as timelines for GetTrace.
//
// A step's summary takes the slowest rank's time (the step ends when the
// last rank does), the last stage's loss (and its evaluation's, when one
// followed the step), and the mean over ranks of each rank's waiting share
// as the bubble.
//
// Not thread-safe: JobManager holds one per job under its mutex.
#ifndef CONVEYOR_COORDINATOR_STEP_AGGREGATOR_H_
#define CONVEYOR_COORDINATOR_STEP_AGGREGATOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

// What a job's shape contributes to a step's rates.
struct StepRates {
  double samples_per_step = 0;
  double tokens_per_sample = 0;  // 0: the model's input is not tokens.
  // For the MFU: the model's training FLOPs per sample
  // (engine::ModelSpec::TrainingFlopsPerSample) and the summed peak FLOP/s
  // of the devices the job runs on, 0 when a worker's is unknown.
  double flops_per_sample = 0;
  double peak_flops = 0;
  // Devices each rank computes on (pipeline.devices_per_stage), for the
  // FLOP/s per device.
  int devices_per_rank = 1;
};

// The summary of one step from every rank's report, by rank.
v1::StepSummary SummarizeStep(int64_t step,
                              const std::vector<v1::StepReport>& reports,
                              const StepRates& rates);

class StepAggregator {
 public:
  // One complete step's reports, by rank.
  using Timelines = std::pair<int64_t, std::vector<v1::StepReport>>;

  // Keeps the timelines of the newest `trace_steps` steps.
  explicit StepAggregator(int trace_steps) : trace_steps_(trace_steps) {}

  // Rank `rank` of `num_ranks` reported its step. The step's summary once
  // every rank has reported it; nullopt before, and for a second report of
  // a rank. The caller checks rank and step against the job.
  std::optional<v1::StepSummary> Add(int rank, int num_ranks,
                                     const v1::StepReport& report,
                                     const StepRates& rates);

  // Forgets incomplete steps (an attempt ended); timelines stay.
  void ClearPending() { pending_.clear(); }
  void ClearTimelines() { timelines_.clear(); }

  // Complete steps' timelines, oldest first.
  const std::deque<Timelines>& timelines() const { return timelines_; }
  // Step `step`'s timelines, the newest for 0; nullptr when not kept.
  const Timelines* Find(int64_t step) const;

 private:
  struct Pending {
    std::vector<v1::StepReport> reports;  // By rank; step 0: not yet.
    int count = 0;
  };

  int trace_steps_;
  std::map<int64_t, Pending> pending_;  // By 1-based step.
  std::deque<Timelines> timelines_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_STEP_AGGREGATOR_H_
