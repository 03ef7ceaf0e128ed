// The value axes of `conveyorctl plot` (plot_command.h): where ticks go and
// how they read. Linear axes get 1, 2 or 5 times a power of ten; log axes
// powers of ten (with 2 and 5, or 3 too, when few decades show). Labels use
// one unit per axis: k, M, G for large values, a power of ten for small
// ones, plain digits between. Internal to cli/.
//
// Pure functions; thread-safe.
#ifndef CONVEYOR_CLI_INTERNAL_PLOT_TICKS_H_
#define CONVEYOR_CLI_INTERNAL_PLOT_TICKS_H_

#include <string>
#include <vector>

namespace conveyor::cli::plot_internal {

struct Tick {
  double value;  // In data units.
  std::string label;
};

// The value range of a panel in plot coordinates (log10 for a log panel).
struct Range {
  double lo = 0;
  double hi = 0;
};

// 1, 2 or 5 times a power of ten, near `raw`; 1 when `raw` is not positive
// and finite.
double NiceStep(double raw);

// A tick value as a person reads it. `resolution` is the difference
// between neighbouring ticks (the digits needed); `magnitude` the axis's
// largest absolute value, which picks one unit for all its labels: k, M, G
// for large numbers ("12.5k" tokens/s), a power of ten for small ones
// ("3e-4" for a learning rate), plain digits between.
std::string TickLabel(double v, double resolution, double magnitude);

// About `target` ticks over `r` at NiceStep spacing. With `log_positions`,
// `r` is in log10 units and the ticks linear in data units (for a log panel
// whose range is too narrow for powers of ten). Near the limits of a double,
// just the ends.
std::vector<Tick> LinearTicks(Range r, int target, bool log_positions);

// Ticks over `r` (log10 units) for a log axis: 1, 2, 5 times powers of ten;
// over many decades the powers alone (every k-th over very many); within
// under one decade 3 joins in, or LinearTicks when even that gives fewer
// than two.
std::vector<Tick> LogTicks(Range r, int target);

}  // namespace conveyor::cli::plot_internal

#endif  // CONVEYOR_CLI_INTERNAL_PLOT_TICKS_H_
