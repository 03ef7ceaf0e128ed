#include "scheduler/schedule.h"

#include "absl/strings/str_cat.h"

namespace conveyor::scheduler {

absl::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved-1f1b";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
    case ScheduleKind::kEager1F1B:
      return "eager-1f1b";
    case ScheduleKind::kInterleavedZeroBubble:
      return "interleaved-zb";
    case ScheduleKind::kZeroBubbleH2:
      return "zb-h2";
    case ScheduleKind::kZeroBubbleV:
      return "zb-v";
    case ScheduleKind::kLoopedBFS:
      return "looped-bfs";
    case ScheduleKind::kDualPipeV:
      return "dualpipev";
  }
  return "?";
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  for (ScheduleKind kind : kAllScheduleKinds) {
    if (ScheduleKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown schedule '", name, "'; allowed: ", kScheduleKindNames));
}

bool SplitsBackward(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleH1 ||
         kind == ScheduleKind::kInterleavedZeroBubble ||
         kind == ScheduleKind::kZeroBubbleH2 ||
         kind == ScheduleKind::kZeroBubbleV || kind == ScheduleKind::kDualPipeV;
}

int DefaultVirtualStages(ScheduleKind kind) {
  return PlacementOf(kind) == Placement::kV ? 2 : 1;
}

bool SendsRendezvous(ScheduleKind kind) {
  return kind != ScheduleKind::kZeroBubbleV && kind != ScheduleKind::kDualPipeV;
}

Placement PlacementOf(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleV || kind == ScheduleKind::kDualPipeV
             ? Placement::kV
             : Placement::kLoop;
}

size_t Schedule::TotalActions() const {
  size_t n = 0;
  for (const auto& rank : actions) n += rank.size();
  return n;
}

}  // namespace conveyor::scheduler
