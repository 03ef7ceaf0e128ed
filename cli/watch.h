// Following a job: WatchPrinter renders the events of the coordinator's
// WatchJob stream (state changes as lines; steps as a progress bar redrawn
// in place on a terminal, or as a line every N steps otherwise), and
// WatchToEnd drives a stream until the job's final state. `watch`,
// `submit --watch` and `run` all show a job this way.
// Thread-compatible: one thread drives a printer.
#ifndef CONVEYOR_CLI_WATCH_H_
#define CONVEYOR_CLI_WATCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/coordinator_client.h"
#include "cli/format.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::cli {

struct WatchOptions {
  int64_t log_every = 0;  // 0: DefaultLogEvery(the job's steps).
  // Redraw one progress bar with "\r" instead of printing lines: for a
  // terminal, where a line per step would scroll the state lines away.
  bool tty = false;
  int bar_width = 24;
  // When each event arrived, for the ETA; empty: absl::Now. Wall time
  // between step events, unlike the steps' own seconds, includes what the
  // pipeline spends between steps.
  std::function<absl::Time()> clock = nullptr;
};

class WatchPrinter {
 public:
  WatchPrinter(std::ostream& out, WatchOptions options)
      : out_(out), options_(options) {}

  // Prints a line for a state change to a non-final state, and the step if
  // the event has one. Final states are left to PrintOutcome.
  void OnEvent(const v1::JobEvent& event);

  // The step part of OnEvent, for a job that is not the coordinator's
  // (`run --in-process`): `job` gives the total of steps.
  void OnStep(const v1::Job& job, const v1::StepSummary& step);

  // Ends the progress bar's line if one is showing, then prints
  // FormatOutcome(job).
  void PrintOutcome(const v1::Job& job);

  // Ends the progress bar's line if one is showing, so that what is printed
  // next starts on a line of its own.
  void EndBar();

 private:
  std::ostream& out_;
  const WatchOptions options_;
  std::optional<v1::JobState> last_state_;
  bool bar_showing_ = false;
  StepTimeEstimator estimator_;
  std::optional<absl::Time> last_step_at_;
  int64_t last_step_ = 0;
};

// Watches job `id` until it ends, printing as WatchPrinter does, the outcome
// included, and returns the job's final form. Errors: the stream's (NotFound
// for an unknown id, Unavailable when the connection broke, Cancelled after
// client.CancelWatches()), and Unavailable when the coordinator ended the
// stream before the job's final state.
absl::StatusOr<v1::Job> WatchToEnd(CoordinatorClient& client,
                                   const std::string& id,
                                   const WatchOptions& options,
                                   std::ostream& out);

// OK for a SUCCEEDED job. Otherwise a status that exits 1 without another
// message, since the outcome has been printed: Aborted for FAILED, Cancelled
// for CANCELLED, Unavailable for a job that has not ended.
absl::Status JobOutcomeStatus(const v1::Job& job);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_WATCH_H_
