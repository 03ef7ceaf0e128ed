// `conveyorctl plot JOB_OR_DIR -o curves.svg`: a job's training curves from
// its history (`<checkpoint.dir>/metrics.jsonl`, cli/metrics_history.h),
// drawn as an SVG in the style of `schedule --format svg`: stacked panels
// over one shared step axis for the loss (with the eval loss as a second
// series with markers), the learning rate, the throughput (tokens/s, or
// samples/s for jobs without tokens) and the gradient norm, each only when
// the history has it. Steps the job ran again after a restart are drawn with
// their last values, and the steps where a restart resumed are marked.
//
// JOB_OR_DIR is, in this order: an existing path ending in ".jsonl" (the
// file itself); an existing directory (its metrics.jsonl); another existing
// path (read as the file); else, when it has no '/', a job id the
// coordinator is asked about (--coordinator etc., as for `status`), whose
// checkpoint.dir must be readable from this machine.
//
// The SVG depends only on the history and the options (no clock, no
// locale). Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_PLOT_COMMAND_H_
#define CONVEYOR_CLI_PLOT_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/coordinator_flags.h"
#include "cli/metrics_history.h"

namespace conveyor::cli {

// For a job id, the coordinator flags as `status` takes them.
struct PlotCommandOptions : CoordinatorFlags {
  std::string source;     // JOB_OR_DIR.
  std::string output;     // Required; "-": standard output.
  int64_t from_step = 0;  // 0: from the first step.
  int64_t to_step = 0;    // 0: to the last step.
  bool log_y = false;     // The loss panel on a log scale.
  int width = 900;        // Pixels of the step axis.
};

CLI::App* AddPlotCommand(CLI::App& app, PlotCommandOptions& options);

struct PlotSvgOptions {
  // In front of "training curves" in the title (a job or directory name).
  // Escaped, so any text is safe.
  std::string title = {};
  bool log_y = false;
  int width = 900;         // Step axis pixels; clamped to [200, 20000].
  int panel_height = 160;  // Plot area pixels of each panel; at least 60.
  int64_t from_step = 0;   // 0: the first step of the history.
  int64_t to_step = 0;     // 0: the last.
};

// The SVG. Its structure, which tests and scripts may rely on: one
// <g id="panel-NAME"> per drawn panel, top to bottom, NAME one of loss,
// learning-rate, throughput, grad-norm; in each, the plot area as
// <rect class="plot" .../> (every panel's has the same x and width: the step
// range maps onto it exactly, as the panel's value range maps onto its
// height, the largest value at the top), and each series as
// <path class="series" id="series-SERIES" d="Mx,yLx,y..."/> with one
// vertex per step that has a value, in step order, and a new "M" where a
// step lacks the value (SERIES: loss, eval-loss, learning-rate,
// tokens-per-second or samples-per-second, grad-norm). Eval points are
// also one <circle class="marker"> each in <g id="markers-eval-loss">.
// With log_y, loss values <= 0 cannot be drawn and are left out, with a
// note. Appends what it left out to `notes` when given.
// Errors: InvalidArgument when no step lies in [from_step, to_step] (saying
// which steps the history has) or no step has any value to draw.
absl::StatusOr<std::string> RenderMetricsSvg(
    const MetricsHistory& history, const PlotSvgOptions& options,
    std::vector<std::string>* notes = nullptr);

// Writes the SVG to options.output (atomically), or to `out` for "-", and
// then a one-line summary to `out` when it wrote a file. Warnings (a
// skipped truncated line, values left out) go to `err`. Errors:
// InvalidArgument for bad options and ReadMetricsHistory's and
// RenderMetricsSvg's errors; NotFound when JOB_OR_DIR is not there (for a
// directory: no metrics.jsonl in it); for a job id, the coordinator's
// errors (CoordinatorClient::GetJob), FailedPrecondition for a job without
// a checkpoint.dir, and the read's error, saying the file is where the
// coordinator wrote it, when it is not readable here.
absl::Status RunPlotCommand(const PlotCommandOptions& options,
                            std::ostream& out, std::ostream& err);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_PLOT_COMMAND_H_
