// MetricsLog: a job's history as `<checkpoint.dir>/metrics.jsonl`, one JSON
// object per completed step, appended by the coordinator as each step's
// reports come in, for pandas (`pd.read_json(path, lines=True)`),
// TensorBoard's and W&B's importers and `jq`:
//
//   {"step": 12, "time_unix_ms": 1764208000123, "restarts": 0,
//    "loss": 2.31, "learning_rate": 0.0003, "step_seconds": 0.41,
//    "samples_per_second": 39.0, "tokens_per_second": 4992.0,
//    "bubble_fraction": 0.18, "eval_loss": 2.40, "eval_perplexity": 11.0}
//
// loss only when the job has one (the last stage reports it), eval_* only
// after a step with an evaluation. A job that restarts or is drained runs
// the steps after its checkpoint again: those steps appear again, with a
// higher "restarts" (a drain does not count one, and redoes no step), so a
// reader keeps the last line of each step. A line is written whole with one
// append; a write error is logged and the job goes on (the history is not
// worth a failed job).
//
// Thread-compatible: JobManager calls it under its mutex.
#ifndef CONVEYOR_COORDINATOR_METRICS_LOG_H_
#define CONVEYOR_COORDINATOR_METRICS_LOG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

inline constexpr char kMetricsLogFileName[] = "metrics.jsonl";

// One line (with its newline) for `step`.
std::string MetricsLogLine(const v1::StepSummary& step, int64_t unix_ms,
                           int restarts);

// Appends `line` to `checkpoint_dir`/metrics.jsonl, creating it; with
// `start_over` (a job's first step from scratch) the file is emptied first,
// so an earlier run's history in the same directory is not mixed in.
absl::Status AppendMetricsLog(const std::string& checkpoint_dir,
                              const std::string& line, bool start_over = false);

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_METRICS_LOG_H_
