// A job's history as the coordinator keeps it in
// `<checkpoint.dir>/metrics.jsonl` (coordinator/metrics_log.h), read back for
// `conveyorctl plot`: one value per step and field, the last line of each
// step winning, since a job that restarts runs the steps after its
// checkpoint again and appends them with a higher "restarts".
//
// Reading is tolerant of what newer or older coordinators write (optional
// fields may be absent, unknown fields are ignored, null is "no value",
// which is how nlohmann-json writes NaN and infinities) and strict about
// everything else: a line that is not a JSON object, lacks "step", or gives
// a known field a value of the wrong type is an error naming file:line.
// The one exception is a truncated last line without its newline, which a
// coordinator killed mid-write leaves behind: it is skipped with a warning.
//
// Pure functions apart from the file read; thread-safe.
#ifndef CONVEYOR_CLI_METRICS_HISTORY_H_
#define CONVEYOR_CLI_METRICS_HISTORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::cli {

// The file's name in a checkpoint directory (coordinator::kMetricsLogFileName).
inline constexpr char kMetricsHistoryFileName[] = "metrics.jsonl";
// A history of a million steps is a few hundred MB; past this the file is
// not a history.
inline constexpr uint64_t kMaxMetricsHistoryBytes = uint64_t{1} << 30;

// The fields of one metrics.jsonl line that `plot` uses; a field the line
// lacks, or holds null or a non-finite number for, is nullopt.
struct MetricsPoint {
  int64_t step = 0;
  int64_t restarts = 0;
  int64_t line = 0;  // 1-based line of the file the values came from.
  std::optional<double> loss;
  std::optional<double> learning_rate;
  std::optional<double> step_seconds;
  std::optional<double> samples_per_second;
  std::optional<double> tokens_per_second;
  std::optional<double> bubble_fraction;
  std::optional<double> eval_loss;
  std::optional<double> eval_perplexity;
  std::optional<double> grad_norm;
  std::optional<double> receive_wait_fraction;
  std::optional<double> mfu;
  std::optional<double> peak_memory_allocated_bytes;
  std::optional<double> peak_memory_reserved_bytes;
};

struct MetricsHistory {
  // One point per step, ascending by step: the last line of each step.
  std::vector<MetricsPoint> points;
  // Lines that were superseded by a later line of the same step (steps run
  // again after a restart).
  int64_t superseded_lines = 0;
  // Highest "restarts" seen.
  int64_t max_restarts = 0;
  // Things the reader passed over that the user should hear about (the
  // truncated last line), each a full sentence starting with file:line.
  std::vector<std::string> warnings;
};

// Parses the contents of a metrics.jsonl; `path` names it in messages.
// Blank lines are passed over. Errors (InvalidArgument unless noted), each
// starting "<path>:<line>: " where it concerns one line:
//   the line is not valid JSON (or has duplicate keys), or is not an object;
//   "step" is missing or not an integer >= 0; "restarts" or "time_unix_ms"
//   is not an integer; a known numeric field is neither a number nor null;
//   FailedPrecondition "<path>: no steps" when no line holds a step (an
//   empty file, or only a truncated line).
absl::StatusOr<MetricsHistory> ParseMetricsHistory(absl::string_view text,
                                                   absl::string_view path);

// Reads and parses the file at `path`. Never blocks: a FIFO, directory or
// device is InvalidArgument "<path>: not a regular file" (common/file.h);
// InvalidArgument past kMaxMetricsHistoryBytes; otherwise the errno-derived
// code (NotFound, PermissionDenied) or ParseMetricsHistory's errors.
absl::StatusOr<MetricsHistory> ReadMetricsHistory(const std::string& path);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_METRICS_HISTORY_H_
