// Plain-text rendering of a pipeline schedule: one line per rank listing its
// actions in program order, e.g.
//
//   rank 2: F2.0 F2.1 F2.2 B2.0 F2.3 B2.1 B2.2 B2.3
//
// so a schedule can be read in a terminal, diffed, or pasted into a test. Pure
// function; thread-safe.
#ifndef CONVEYOR_SCHEDULER_RENDER_TEXT_H_
#define CONVEYOR_SCHEDULER_RENDER_TEXT_H_

#include <string>

#include "scheduler/schedule.h"

namespace conveyor::scheduler {

// One line per entry of schedule.actions, each "rank <r>:" followed by the
// rank's actions (ToString) separated by single spaces and ended by '\n'. A
// rank with no actions prints "rank <r>:". Rank numbers are not padded, so a
// line reads the same whatever P is.
std::string RenderText(const Schedule& schedule);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_RENDER_TEXT_H_
