// A measured training step, as `conveyorctl trace` shows it: the per-rank
// timelines the workers recorded (v1::Trace) rendered for a person to look at,
// and their time split into compute, communication and idle.
//
//  - RenderChromeTrace: Chrome trace event JSON for Perfetto or
//    chrome://tracing, with one process per rank and one track per stream
//    (compute, communication, idle), so the full detail can be zoomed into.
//  - RenderTraceSvg: the pipeline view of `conveyorctl schedule --format svg`
//    (scheduler::RenderSvg), drawn from measured times instead of simulated
//    ones, so a predicted and a measured schedule can be put side by side.
//  - AccountTrace / FormatAccounting: where each rank's step time went.
//  - ExplainBubble / FormatBubbleBreakdown: the step's bubble split into
//    what its stages' imbalance explains and what comes on top.
//
// A trace's span times are microseconds relative to their rank's step start
// (RankTrace.start_unix_us); the renderers put all ranks on one axis that
// starts at the earliest rank start of the trace, so the ranks' clocks must
// roughly agree for the picture to be meaningful (it is only as good as the
// hosts' clock sync). Pure functions of their inputs; thread-safe.
#ifndef CONVEYOR_CLI_TRACE_RENDER_H_
#define CONVEYOR_CLI_TRACE_RENDER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "conveyor/v1/conveyor.pb.h"
#include "scheduler/render_svg.h"

namespace conveyor::cli {

// Chrome trace event format, object form:
//   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
// otherData holds the job id and name, step, schedule and its shape.
// Rank R is process R + 1 named "rank R: <worker_name> (<worker_id>)" and
// sorted by rank. Its tracks are tid 1 "compute" (F, B, BI, BW, loss, data,
// optimizer), tid 2 "communication" (send, all-reduce) and tid 3 "idle"
// (recv wait). Every span is one complete ("X") event with ts and dur in
// microseconds, ts relative to the earliest rank start. Names follow the
// schedule notation ("F2.3", "BI0.1") for stage actions and are "loss",
// "data", "send", "recv wait", "optimizer", "all-reduce" otherwise; args
// carry stage, microbatch and peer when set (>= 0) and bytes for sends and
// receive waits. A negative duration is written as 0 (the viewers reject
// it); a span kind this build does not know goes on the compute track as
// "span <kind>". Never fails: text that is not UTF-8 is replaced, so the
// output is always valid JSON.
std::string RenderChromeTrace(const v1::Trace& trace);

// An SVG in the style of scheduler::RenderSvg: one row per rank, one box per
// F/B/BI/BW span in time order, times in milliseconds from the earliest rank
// start. A forward's box also covers the DATA spans of the same stage and
// microbatch right before it and the LOSS (or DATA) spans of the same stage
// and microbatch right after it, since for the pipeline they are part of the
// forward. Other spans (sends, receive waits, optimizer, all-reduce) are not
// drawn: the gaps they leave are the time not spent in the pipeline's
// compute, as in the simulated picture.
//
// The makespan is the latest end of a drawn box, so the bubble in the title
// (idle over P times makespan) compares with the simulated schedule's; the
// optimizer step after the pipeline is not part of it.
// options.title defaults to "<job_id> step <N> (measured)".
//
// Returns InvalidArgument when the trace cannot be drawn: no ranks; the
// number of ranks differs from num_ranks, or a rank number is out of range
// or repeated; V or M below 1, or P*V*M too large; an unknown schedule name;
// a stage action whose stage is outside [0, P*V) or not on its rank
// (by the schedule's placement) or whose microbatch is outside [0, M); a span
// with a negative start or duration.
absl::StatusOr<std::string> RenderTraceSvg(const v1::Trace& trace,
                                           scheduler::SvgOptions options = {});

// Where one rank's step time went, in seconds. compute: forward, backward
// (B, BI, BW), loss, data and optimizer spans; communication: send and
// all-reduce; idle: receive waits. step_seconds is the rank's reported step
// time (RankTrace.seconds); the three sums fall short of it by whatever the
// worker did not record as a span.
struct RankAccounting {
  int rank = 0;
  double compute_seconds = 0;
  double communication_seconds = 0;
  double idle_seconds = 0;
  double step_seconds = 0;
};

// One row per RankTrace, in the trace's order. Durations are summed in
// integer microseconds and converted once, so the sums are exact up to that
// conversion. Spans of kinds this build does not know count nowhere.
std::vector<RankAccounting> AccountTrace(const v1::Trace& trace);

// A text table, one line per rank after a header: compute, communication,
// idle and step time in milliseconds, and (compute + communication + idle) /
// step as a percentage ("-" when the step time is not positive). Columns are
// padded to their widest cell, two spaces apart, no trailing spaces.
std::string FormatAccounting(const std::vector<RankAccounting>& rows);

// The step's bubble against what the simulator predicts for the same
// actions in the same order, once at the step's own per-stage costs (the
// median of each stage's measured F, B, BI and BW boxes, as RenderTraceSvg
// draws them: a forward with its data reads and loss) and once at their
// mean over the stages (uniform stages, the schedule's textbook bubble).
// The first gap is the stage cut's imbalance; what the measured bubble adds
// on top of it is communication, the runtime, and actions of one stage that
// took longer than its median (a slow first microbatch on the critical
// path counts here, not as imbalance). All three
// are fractions of P x makespan, the measured one as in RenderTraceSvg's
// title and the coordinator's bubble (telemetry/step_timeline.h), both
// simulations at zero latency.
struct BubbleBreakdown {
  double measured = 0;
  double at_stage_costs = 0;
  double at_uniform_costs = 0;
};

// RenderTraceSvg's InvalidArgument cases, and the simulator's errors for a
// trace whose actions do not make a whole step (a rank without spans).
absl::StatusOr<BubbleBreakdown> ExplainBubble(const v1::Trace& trace);

// One line: "bubble 24.5% measured; simulated for these actions: 22.1% at
// this step's stage costs, 20.0% at uniform stages (stage imbalance +2.1
// points; communication, runtime and uneven actions +2.4)".
std::string FormatBubbleBreakdown(const BubbleBreakdown& bubble);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_TRACE_RENDER_H_
