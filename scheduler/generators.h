// Schedule generators: gpipe, 1f1b (PipeDream-flush), interleaved-1f1b
// (Megatron-style, V >= 1), zb-h1 and zb-h2 (zero-bubble H1 and H2, Qi et
// al. 2023), eager-1f1b (JaxPP's Eager1F1B), interleaved-zb (ZB1P), zb-v
// (ZB-V, two stages a rank in a V) and looped-bfs.
//
// Every generator accepts any M >= 1 it can serve without risking a hang;
// where a schedule needs more (gpipe and interleaved-1f1b with V > 1 need
// M % P == 0) it returns InvalidArgument naming the constraint instead. The
// output of every generator passes ValidateSchedule (property-tested over P
// in 1..16, M in 1..64, V in 1..4). Pure functions; thread-safe.
#ifndef CONVEYOR_SCHEDULER_GENERATORS_H_
#define CONVEYOR_SCHEDULER_GENERATORS_H_

#include "absl/status/statusor.h"
#include "scheduler/schedule.h"

namespace conveyor::scheduler {

// Upper bounds that keep a typo from allocating gigabytes.
inline constexpr int kMaxRanks = 4096;
inline constexpr int kMaxVirtualStages = 64;
inline constexpr int kMaxMicrobatches = 1 << 20;

struct ScheduleOptions {
  int ranks = 1;           // P >= 1
  int microbatches = 1;    // M >= 1
  int virtual_stages = 1;  // V >= 1; see TakesVirtualStages
};

// True for the kinds that take V > 1 virtual stages per rank: gpipe,
// interleaved-1f1b, interleaved-zb, looped-bfs and zb-v (V = 2 only).
bool TakesVirtualStages(ScheduleKind kind);

// The checks every generator makes of `options` for `kind`: P, M and V in
// range, V as the kind takes it, P*V*M within kMaxStageMicrobatches, and
// (unless `forward_only`, scheduler/forward_only.h) the kind's own rule on
// M (dualpipev: M >= 2P). InvalidArgument naming the field and the rule.
absl::Status CheckScheduleOptions(ScheduleKind kind,
                                  const ScheduleOptions& options,
                                  bool forward_only = false);

// A schedule of `kind` with `options`' shape, the kind's placement and no
// actions yet (one empty program per rank), for a generator to fill.
Schedule EmptySchedule(ScheduleKind kind, const ScheduleOptions& options);

// Dispatches on `kind`. InvalidArgument for out-of-range options or a
// combination the schedule does not support, with the field and the rule.
absl::StatusOr<Schedule> GenerateSchedule(ScheduleKind kind,
                                          const ScheduleOptions& options);

// GPipe: all forwards, then all backwards in the same microbatch order
// (chunks last to first). With V > 1,
// microbatches go through the chunks in groups of P (M % P == 0 needed).
absl::StatusOr<Schedule> GenerateGPipe(const ScheduleOptions& options);

// 1F1B (PipeDream-flush): rank r runs min(P-r-1, M) warm-up forwards, then
// alternates one forward and one backward, then drains. At most P-r
// microbatches are in flight on rank r. V must be 1.
absl::StatusOr<Schedule> Generate1F1B(const ScheduleOptions& options);

// Interleaved 1F1B (Megatron-LM): rank r runs min(2(P-r-1) + (V-1)P, M*V)
// warm-up forwards, microbatches taken in groups of P, chunk by chunk. V = 1 is
// JaxPP's Interleaved1F1B warm-up rule. V > 1 needs M % P == 0.
absl::StatusOr<Schedule> GenerateInterleaved1F1B(
    const ScheduleOptions& options);

// Zero-bubble H1: 1F1B's order of F and BI, with each BW deferred to fill the
// bubble. Counting a microbatch as stashed until its BW, every rank peaks at P,
// which is 1F1B's pipeline-wide peak (its first rank). Rank r holds back up to
// r weight gradients during the steady phase and runs one per BI while
// draining, which gives a makespan of M(F+BI+BW) + (P-1)(F+BI-BW) at unit costs
// with M >= P, against 1F1B's (M+P-1)(F+BI+BW). V must be 1.
absl::StatusOr<Schedule> GenerateZeroBubbleH1(const ScheduleOptions& options);

// Eager 1F1B (JaxPP's Eager1F1B): rank r runs min(2(P-r)-1, M) warm-up
// forwards, then alternates one backward and one forward, then drains. With
// free communication its makespan is 1F1B's, (M+P-1)(F+B); the extra
// forwards (up to 2(P-r)-1 microbatches in flight on rank r, about twice
// 1F1B's activations) let each send complete while the receiver is still
// busy, hiding transfer time that 1F1B's rank pairs wait for. V must be 1.
absl::StatusOr<Schedule> GenerateEager1F1B(const ScheduleOptions& options);

// Interleaved zero bubble (ZB1P; PyTorch's ScheduleInterleavedZeroBubble,
// with a deeper warm-up): with V > 1, microbatches go through the chunks in
// groups of P (M % P == 0 needed), as in interleaved-1f1b. Rank r runs
// min((V-1)P + 2(P-1-r), MV) warm-up forwards (V = 1: min(P-1-r, M));
// then each step is a forward and an input-gradient backward (BI), and
// after the forwards the BIs drain alone. From the (r+1)-th step on, every
// BI is followed by the rank's oldest held-back weight gradient (BW); the
// rest run at the end. At unit costs (F = BI = BW) and M >= P its bubble is
// (P-1)/(3MV+P-1), zb-h1's at V = 1. PyTorch's warm-up, (V-1)P + P-1-r,
// deadlocks under rendezvous sends (P = 4, M = 8, V = 2).
absl::StatusOr<Schedule> GenerateInterleavedZeroBubble(
    const ScheduleOptions& options);

// Zero-bubble H2: rank r runs min(2(P-r-1), M) warm-up forwards, so its
// first BI comes after 2(P-r)-1 forwards (the wait for the first gradient,
// filled), then zb-h1's pairs of F and BI, holding back 2r BWs. Up to
// 2(P-r)-1 microbatches are stashed on rank r, about twice 1F1B's peak. With
// M >= 2P-1 its makespan is M(F+BI+BW) + (P-1)F, the floor for a step that
// ends in a synchronous optimizer update (rank P-1 cannot start before P-1
// forwards and then has M(F+BI+BW) of work); at F = BI = BW that is
// zb-h1's, (P-1)/(3M+P-1), and with BI > BW it is shorter (with M < P it
// can be a few units longer than zb-h1's). The paper's ZB-H2
// has no bubble at all only by moving the optimizer step off the critical
// path, which a synchronous step cannot. V must be 1.
absl::StatusOr<Schedule> GenerateZeroBubbleH2(const ScheduleOptions& options);

// Zero bubble V (ZB-V, Qi et al. 2024; PyTorch's ScheduleZBVZeroBubble,
// action for action): V must be 2 and the placement is v, so rank r holds
// stages r and 2P-1-r. Rank r warms up with 2(P-r)-1 chunk-0 forwards, r
// pairs of chunk-1 and chunk-0 forwards, and P-r chunk-1 F, BI, BW triples;
// then each chunk runs F, BI, BW in turn; the cool-down runs the BI chain
// first and the held-back BWs last. The order is laid out for max(M, 2P-1)
// microbatches and the surplus dropped. Up to 2P microbatch-stages are
// stashed on a rank (1F1B's memory at half-size stages). With M >= 2P and
// F = BI = BW its bubble is (P-1)/(6M+P-1), half zb-h1's over the same
// model. Its sends must not wait for their receivers (SendsRendezvous is
// false): every Conveyor channel buffers them.
absl::StatusOr<Schedule> GenerateZeroBubbleV(const ScheduleOptions& options);

// Looped BFS (PyTorch's ScheduleLoopedBFS): a rank's chunks breadth first,
// every microbatch through one chunk before the next. Under rendezvous sends
// pushing all M microbatches through a chunk deadlocks once M >= 2P (the
// last rank's chunk-0 outputs wait for rank 0, still sending chunk-0 work),
// so microbatches go through the chunks in groups of P (M % P == 0 needed
// with V > 1), the same order as gpipe with V > 1; backwards run microbatches
// ascending for the bitwise-equal accumulation order. V = 1 is gpipe.
absl::StatusOr<Schedule> GenerateLoopedBFS(const ScheduleOptions& options);

// DualPipeV (DeepSeek-V3's DualPipe folded into a V; PyTorch's
// ScheduleDualPipeV, action for action): V must be 2, the placement is v,
// and M >= 2P. Its main phase pairs a forward of one chunk with a full
// backward of the other, which DualPipe overlaps (one chunk's communication
// under the other's compute); Conveyor's executor runs each pair in turn and
// the simulator models it so. Warm-up and drain split backwards into BI and
// BW to fill the bubble. Its sends must not wait for their receivers
// (SendsRendezvous is false).
absl::StatusOr<Schedule> GenerateDualPipeV(const ScheduleOptions& options);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_GENERATORS_H_
