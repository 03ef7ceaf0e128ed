// Closed-form bubble fractions from the literature, for comparison with the
// simulator: idle rank-time over total rank-time, assuming every stage costs
// the same and communication is free. Pure functions; thread-safe.
#ifndef CONVEYOR_SCHEDULER_CLOSED_FORM_H_
#define CONVEYOR_SCHEDULER_CLOSED_FORM_H_

#include <cstdint>
#include <optional>

#include "scheduler/schedule.h"

namespace conveyor::scheduler {

struct Fraction {
  int64_t numerator = 0;
  int64_t denominator = 1;
  double value() const {
    return static_cast<double>(numerator) / static_cast<double>(denominator);
  }
};

// The bubble fraction in lowest terms, or nullopt where no closed form
// applies:
//   gpipe, 1f1b, eager-1f1b (V = 1):   (P-1) / (M+P-1)
//   gpipe (V > 1, P | M),
//   interleaved-1f1b (V = 1 or P | M): (P-1) / (MV+P-1), costs per virtual
//                                      stage
//   zb-h1, zb-h2 (M >= P, F = BI = BW): (P-1) / (3M+P-1)
//   interleaved-zb (M >= P; V > 1: P | M),
//   zb-v, dualpipev (V = 2, M >= 2P),
//   F = BI = BW:                       (P-1) / (3MV+P-1)
// dualpipev's form counts each paired F and B in turn, as Conveyor runs
// them (DualPipe overlaps the pair's communication with its compute).
// The zb-h1 form is the paper's (P-1)(F+BI-BW) bubble per rank over a
// makespan of M(F+BI+BW) + (P-1)(F+BI-BW), at F = BI = BW.
std::optional<Fraction> ClosedFormBubbleFraction(ScheduleKind kind, int ranks,
                                                 int microbatches,
                                                 int virtual_stages);

// A one-line statement of the assumptions behind the closed form of `kind`.
const char* ClosedFormAssumptions(ScheduleKind kind);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_CLOSED_FORM_H_
