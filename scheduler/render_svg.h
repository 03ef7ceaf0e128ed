// SVG timeline of a simulated schedule, so a person can look at a schedule
// rather than read it: one row per rank, time running left to right, one box
// per action from its simulated start to its end. Forward, backward and the
// two halves of a split backward (BI, BW) have distinct colours; with V > 1
// each virtual chunk gets its own shade of the op's colour (lighter for chunk
// 0, darker for later chunks). Boxes wide enough show their microbatch number.
// Idle time is left blank, so the bubble shows as gaps.
//
// The output is a standalone, well-formed SVG 1.1 document and depends only on
// its inputs (no clock, no locale), so the same schedule gives the same bytes.
// Pure function; thread-safe.
#ifndef CONVEYOR_SCHEDULER_RENDER_SVG_H_
#define CONVEYOR_SCHEDULER_RENDER_SVG_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace conveyor::scheduler {

struct SvgOptions {
  // Width in pixels of the time axis: the makespan maps onto this many pixels
  // right of the rank labels. Clamped to at least 100.
  int width = 1600;
  // Height in pixels of one rank's row; boxes leave a small gap between rows.
  // Clamped to at least 2. Below about 12 the microbatch numbers no longer fit
  // and are left out.
  int row_height = 22;
  // Put in front of the title line, e.g. a job name. Escaped, so any text is
  // safe. (The explicit initializer keeps GCC's -Wmissing-field-initializers
  // quiet for callers that write designated initializers like {.width = 800}.)
  std::string title = {};
  // Give each box a <title> tooltip ("F2.3: 10 to 12"), unless the schedule
  // has more than max_tooltip_actions actions. A tooltip roughly doubles the
  // bytes per box; for a schedule that large the boxes are too narrow to
  // hover over one anyway.
  bool tooltips = true;
  size_t max_tooltip_actions = 20000;
  // The time axis's unit, shown in its label ("time (ms)"); empty: the
  // costs' own units, unnamed ("time").
  std::string time_unit = {};
};

// Renders `schedule` with the timings of `result` (Simulate's output for that
// schedule). result.timings must be parallel to schedule.actions; an action
// without a timing is not drawn (never an out-of-bounds read). Every drawn
// action is exactly one <rect> inside its rank's <g id="rank-R"> group.
template <typename T>
std::string RenderSvg(const Schedule& schedule,
                      const SimulationResult<T>& result,
                      const SvgOptions& options = {});

extern template std::string RenderSvg(const Schedule&,
                                      const SimulationResult<int64_t>&,
                                      const SvgOptions&);
extern template std::string RenderSvg(const Schedule&,
                                      const SimulationResult<double>&,
                                      const SvgOptions&);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_RENDER_SVG_H_
