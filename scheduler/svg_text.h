// Text for SVG files: coordinates and escaped strings, shared by every SVG
// this project draws (schedules and traces, scheduler/render_svg.h; training
// curves, cli/plot_command.h), so they format numbers and escape text one
// way.
#ifndef CONVEYOR_SCHEDULER_SVG_TEXT_H_
#define CONVEYOR_SCHEDULER_SVG_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace conveyor::scheduler {

// Fixed-point with at most two decimals and no trailing zeros ("12.5",
// "3", "-0.25"): 0.01 px is finer than any display, and short numbers keep
// large files small. Locale independent (std::to_chars), so output is
// deterministic; a NaN or infinity is "0".
std::string SvgNumber(double v);

// `text` for an attribute value or element content: &, <, >, " and '
// escaped; control characters other than tab and newline, which XML 1.0
// does not allow even escaped, become '?'.
std::string SvgEscape(absl::string_view text);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_SVG_TEXT_H_
