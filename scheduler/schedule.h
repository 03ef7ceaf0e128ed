// A pipeline schedule: for each of P ranks, the ordered compute actions it runs
// in one training step. There are P*V stages, placed on the ranks by the
// schedule's placement (scheduler/placement.h): stage s on rank s mod P for
// most kinds, so with V > 1 ("virtual stages") rank r holds stages r, r+P,
// ..., r+(V-1)P; V-shaped for zb-v. Plain value type; thread-compatible.
#ifndef CONVEYOR_SCHEDULER_SCHEDULE_H_
#define CONVEYOR_SCHEDULER_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/action.h"
#include "scheduler/placement.h"

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
  // Zero bubble H2: ZB-H1 with up to twice the warm-up forwards, so the
  // bubble before the first backward fills too (about 2x 1F1B's memory).
  kZeroBubbleH2,
  // Zero bubble V (ZB-V): two stages a rank, placed in a V.
  kZeroBubbleV,
  // Looped breadth-first (PyTorch's ScheduleLoopedBFS): every microbatch
  // through a rank's chunk before the next chunk, V >= 1.
  kLoopedBFS,
  // DualPipeV (DeepSeek; PyTorch's ScheduleDualPipeV): zb-v's placement,
  // with forwards paired with backwards of the other chunk.
  kDualPipeV,
};

// The names used in job YAML and on the command line, comma-separated.
inline constexpr absl::string_view kScheduleKindNames =
    "gpipe, 1f1b, interleaved-1f1b, zb-h1, eager-1f1b, interleaved-zb, zb-h2, "
    "zb-v, looped-bfs, dualpipev";

// Every kind, in the order of kScheduleKindNames.
inline constexpr ScheduleKind kAllScheduleKinds[] = {
    ScheduleKind::kGPipe,           ScheduleKind::k1F1B,
    ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleH1,
    ScheduleKind::kEager1F1B,       ScheduleKind::kInterleavedZeroBubble,
    ScheduleKind::kZeroBubbleH2,    ScheduleKind::kZeroBubbleV,
    ScheduleKind::kLoopedBFS,       ScheduleKind::kDualPipeV};

// "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "eager-1f1b",
// "interleaved-zb", "zb-h2", "zb-v", "looped-bfs", "dualpipev".
absl::string_view ScheduleKindName(ScheduleKind kind);

// Inverse of ScheduleKindName. InvalidArgument lists the allowed names.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);

// True for the kinds that split backwards into BI and BW (zb-h1,
// interleaved-zb, zb-h2, zb-v; dualpipev splits some and runs B for the
// rest); the others run B.
bool SplitsBackward(ScheduleKind kind);

// Where `kind` puts its stages: v for zb-v and dualpipev, loop for the
// others.
Placement PlacementOf(ScheduleKind kind);

// The virtual stages `kind` runs when a job or command does not say: 2 for
// the v-placed kinds (zb-v, dualpipev), which hold exactly two a rank; 1
// otherwise.
int DefaultVirtualStages(ScheduleKind kind);

// Whether `kind` runs with rendezvous sends (a send completes only once the
// peer has posted the matching receive, as raw NCCL does): every kind but
// zb-v and dualpipev, whose orders (PyTorch's) need a send to complete while
// its receiver is busy. Every channel Conveyor has buffers sends
// (transport/channel.h; the NCCL channel through its rounds), so both run on
// them; scheduler/validator.h proves each kind under its own model.
bool SendsRendezvous(ScheduleKind kind);

// The most (stage, microbatch) pairs a schedule may have, P*V*M. Generators,
// the validator and the simulator allocate per pair; the bound keeps a typo or
// a hostile schedule file from exhausting memory.
inline constexpr int64_t kMaxStageMicrobatches = int64_t{1} << 25;

struct Schedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int ranks = 1;           // P
  int virtual_stages = 1;  // V
  int microbatches = 1;    // M
  Placement placement = Placement::kLoop;
  // Forwards only (scheduler/forward_only.h: an evaluation pass); `kind` is
  // then the training schedule's, for its placement and send model.
  bool forward_only = false;
  // ranks entries; actions[r] is rank r's program for one step.
  std::vector<std::vector<Action>> actions;

  int num_stages() const { return ranks * virtual_stages; }
  int RankOfStage(int stage) const {
    return StageRank(placement, stage, ranks);
  }
  bool IsLastStage(int stage) const { return stage == num_stages() - 1; }
  size_t TotalActions() const;
  // P*V*M, without overflow for any int inputs.
  int64_t StageMicrobatches() const {
    return static_cast<int64_t>(ranks) * virtual_stages * microbatches;
  }
};

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_SCHEDULE_H_
