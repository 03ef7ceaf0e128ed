// Where `conveyorctl plot JOB_OR_DIR` (plot_command.h) finds a job's
// history: JOB_OR_DIR resolved, in plot_command.h's order, to a
// metrics.jsonl path and a title, asking the coordinator for a job id; and a
// failure to read that file explained in terms of where the path came from
// (the coordinator's checkpoint.dir, or a directory that is not a checkpoint
// directory). Internal to cli/.
//
// Thread-compatible: the options and streams are the caller's.
#ifndef CONVEYOR_CLI_INTERNAL_HISTORY_SOURCE_H_
#define CONVEYOR_CLI_INTERNAL_HISTORY_SOURCE_H_

#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/plot_command.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::cli::plot_internal {

// Where a JOB_OR_DIR's history is.
struct HistorySource {
  std::string path;
  std::string title;
  // For a job id: the job, for messages.
  std::optional<v1::Job> job;
  bool directory = false;  // JOB_OR_DIR was a directory.
};

// Resolves o.source. NotFound for a path that does not exist (or a job-less
// name with '/' or ".jsonl"); the stat error otherwise; for a job id, the
// coordinator's error (naming both readings of the argument) or
// FailedPrecondition for a job without a checkpoint.dir. Connecting reports
// on `err` as ConnectToCoordinator does.
absl::StatusOr<HistorySource> LocateHistory(const PlotCommandOptions& o,
                                            std::ostream& err);

// A failure to read `source`'s file, said in terms of where it came from;
// the code is `status`'s.
absl::Status ExplainReadError(const HistorySource& source,
                              const absl::Status& status);

}  // namespace conveyor::cli::plot_internal

#endif  // CONVEYOR_CLI_INTERNAL_HISTORY_SOURCE_H_
