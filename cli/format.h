// How conveyorctl shows jobs, workers and training progress: pure functions
// from the protocol's messages to text, so every output can be tested
// without a coordinator or a terminal. Times are rendered relative to a
// `now` the caller passes in, for the same reason.
// Thread-safe (pure functions; StepTimeEstimator is thread-compatible).
#ifndef CONVEYOR_CLI_FORMAT_H_
#define CONVEYOR_CLI_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::cli {

// "0.4 s" under a minute (one decimal under 10 s), then "4m05s", "1h02m",
// "3d04h". Negative or non-finite input reads "-".
std::string FormatDuration(double seconds);

// Columns padded to their widest cell, two spaces apart, no trailing spaces.
// Rows shorter than the header leave the remaining cells empty.
std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);

// The --log-every default for a job of `steps_total` steps: about 20 lines
// over the job (at least 1).
int64_t DefaultLogEvery(int64_t steps_total);

// Whether a line-per-step log prints `step`: every `log_every`-th step, and
// always the first and the last, so the start and the end of the loss curve
// are visible.
bool ShouldLogStep(int64_t step, int64_t steps_total, int64_t log_every);

// Smooths step times (an exponential moving average, which follows a warmup
// that is slower than the steady state) to estimate the time left.
class StepTimeEstimator {
 public:
  void Add(double step_seconds);
  // Seconds for the steps after `steps_done`; nullopt before any step.
  std::optional<double> Remaining(int64_t steps_done,
                                  int64_t steps_total) const;

 private:
  std::optional<double> average_;
};

// One step as a log line, the same shape `run --in-process` prints:
//   step  40/200  loss 0.123456  lr 0.003  3.2 ms  40000 samples/s
//   [ 9000 tokens/s]  [bubble 12.5%]  [ETA 5.1 s]
std::string FormatStepLine(const v1::StepSummary& step, int64_t steps_total,
                           std::optional<double> eta_seconds);

// The live progress line a terminal redraws in place (no "\r"):
//   [#########-----------]  40/200  loss 0.123456  40000 samples/s
//   3.2 ms/step  ETA 5.1 s
std::string FormatProgressBar(const v1::StepSummary& step, int64_t steps_total,
                              std::optional<double> eta_seconds, int width);

// A state change as watch shows it: "job-7 (mlp): QUEUED, position 1",
// "job-7 (mlp): PLANNING on worker-1, worker-2", "job-7 (mlp): RUNNING:
// 1f1b: 2 worker(s) x 1 virtual stage(s) = 2 stage(s); ... on worker-1, ...".
std::string FormatStateLine(const v1::Job& job);

// The last line of a watch: "SUCCEEDED: 200/200 steps in 12.3 s, final loss
// 0.012345", "FAILED: <reason>", "CANCELLED: <reason>"; for a job that has
// not ended, "<STATE>: <steps_done>/<steps_total> steps".
std::string FormatOutcome(const v1::Job& job);

// `conveyorctl status`: the job's fields, then its stages and their workers.
std::string FormatJobDetails(const v1::Job& job, absl::Time now);

// `conveyorctl jobs`.
std::string FormatJobsTable(const std::vector<v1::Job>& jobs, absl::Time now);

// `conveyorctl workers`.
std::string FormatWorkersTable(const std::vector<v1::Worker>& workers);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_FORMAT_H_
