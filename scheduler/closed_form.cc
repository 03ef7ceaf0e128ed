#include "scheduler/closed_form.h"

#include <numeric>

namespace conveyor::scheduler {

namespace {

Fraction Reduced(int64_t numerator, int64_t denominator) {
  const int64_t g = std::gcd(numerator, denominator);
  return g > 1 ? Fraction{numerator / g, denominator / g}
               : Fraction{numerator, denominator};
}

}  // namespace

std::optional<Fraction> ClosedFormBubbleFraction(ScheduleKind kind, int ranks,
                                                 int microbatches,
                                                 int virtual_stages) {
  const int64_t p = ranks, m = microbatches, v = virtual_stages;
  if (p < 1 || m < 1 || v < 1) return std::nullopt;
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kLoopedBFS:  // gpipe's order
      if (v == 1) return Reduced(p - 1, m + p - 1);
      if (m % p == 0) return Reduced(p - 1, m * v + p - 1);
      return std::nullopt;
    case ScheduleKind::k1F1B:
    case ScheduleKind::kEager1F1B:
      if (v != 1) return std::nullopt;
      return Reduced(p - 1, m + p - 1);
    case ScheduleKind::kInterleaved1F1B:
      if (v != 1 && m % p != 0) return std::nullopt;
      return Reduced(p - 1, m * v + p - 1);
    case ScheduleKind::kZeroBubbleH1:
      if (v != 1 || m < p) return std::nullopt;
      return Reduced(p - 1, 3 * m + p - 1);
    case ScheduleKind::kInterleavedZeroBubble:
      if (m < p || (v > 1 && m % p != 0)) return std::nullopt;
      return Reduced(p - 1, 3 * m * v + p - 1);
    case ScheduleKind::kZeroBubbleH2:
      if (v != 1 || m < p) return std::nullopt;
      return Reduced(p - 1, 3 * m + p - 1);
    case ScheduleKind::kZeroBubbleV:
    case ScheduleKind::kDualPipeV:
      if (v != 2 || m < 2 * p) return std::nullopt;
      return Reduced(p - 1, 6 * m + p - 1);
  }
  return std::nullopt;
}

const char* ClosedFormAssumptions(ScheduleKind kind) {
  if (kind == ScheduleKind::kZeroBubbleV) {
    return "uniform stages, free communication, F = BI = BW, M >= 2P";
  }
  if (kind == ScheduleKind::kDualPipeV) {
    return "uniform stages, free communication, F = BI = BW, B = BI + BW "
           "(each F and B pair run in turn), M >= 2P";
  }
  return SplitsBackward(kind)
             ? "uniform stages, free communication, F = BI = BW, M >= P"
             : "uniform stages, free communication";
}

}  // namespace conveyor::scheduler
