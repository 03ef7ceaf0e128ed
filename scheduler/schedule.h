// A pipeline schedule: for each of P ranks, the ordered compute actions it runs
// in one training step. There are P*V stages; stage s lives on rank s mod P, so
// with V > 1 ("virtual stages") rank r holds stages r, r+P, ..., r+(V-1)P.
// Plain value type; thread-compatible.
#ifndef CONVEYOR_SCHEDULER_SCHEDULE_H_
#define CONVEYOR_SCHEDULER_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/action.h"

namespace conveyor::scheduler {

enum class ScheduleKind : unsigned char {
  kGPipe,
  k1F1B,
  kInterleaved1F1B,
  kZeroBubbleH1,
  // 1F1B with up to twice the warm-up forwards (JaxPP's Eager1F1B), so sends
  // run ahead of the downstream backwards.
  kEager1F1B,
  // Zero bubble with V >= 1 virtual stages a rank (ZB1P, PyTorch's
  // ScheduleInterleavedZeroBubble).
  kInterleavedZeroBubble,
};

// The names used in job YAML and on the command line, comma-separated.
inline constexpr absl::string_view kScheduleKindNames =
    "gpipe, 1f1b, interleaved-1f1b, zb-h1, eager-1f1b, interleaved-zb";

// Every kind, in the order of kScheduleKindNames.
inline constexpr ScheduleKind kAllScheduleKinds[] = {
    ScheduleKind::kGPipe,           ScheduleKind::k1F1B,
    ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleH1,
    ScheduleKind::kEager1F1B,       ScheduleKind::kInterleavedZeroBubble};

// "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "eager-1f1b",
// "interleaved-zb".
absl::string_view ScheduleKindName(ScheduleKind kind);

// Inverse of ScheduleKindName. InvalidArgument lists the allowed names.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);

// True for the kinds that split each backward into BI and BW (zb-h1,
// interleaved-zb); the others run B.
bool SplitsBackward(ScheduleKind kind);

// The most (stage, microbatch) pairs a schedule may have, P*V*M. Generators,
// the validator and the simulator allocate per pair; the bound keeps a typo or
// a hostile schedule file from exhausting memory.
inline constexpr int64_t kMaxStageMicrobatches = int64_t{1} << 25;

struct Schedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int ranks = 1;           // P
  int virtual_stages = 1;  // V
  int microbatches = 1;    // M
  // ranks entries; actions[r] is rank r's program for one step.
  std::vector<std::vector<Action>> actions;

  int num_stages() const { return ranks * virtual_stages; }
  int RankOfStage(int stage) const { return stage % ranks; }
  bool IsLastStage(int stage) const { return stage == num_stages() - 1; }
  size_t TotalActions() const;
  // P*V*M, without overflow for any int inputs.
  int64_t StageMicrobatches() const {
    return static_cast<int64_t>(ranks) * virtual_stages * microbatches;
  }
};

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_SCHEDULE_H_
