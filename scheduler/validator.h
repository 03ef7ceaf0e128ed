// Schedule validator: proves a schedule can run on the workers before any
// worker allocates anything.
//
// Checks, in order, reporting the first violation found:
//  1. Every action belongs to its rank (the schedule's placement), stays within
//     the stages and microbatches, and appears once; a (stage, microbatch)
//     uses either B or BI+BW, never both.
//  2. Order on each rank: F(s,mb) after F(s-1,mb); B/BI(s,mb) after F(s,mb)
//     and after B/BI(s+1,mb); BW(s,mb) after BI(s,mb).
//  3. Completeness: every F, and every B (or BI and BW), is present; a
//     forward-only schedule (scheduler/forward_only.h) has every F and no
//     backward.
//  4. Messages: between each ordered pair of ranks, the sequence of tensors
//     sent equals the sequence of tensors expected, because in-order
//     transports (NCCL) match sends to receives by position, not by tag.
//  5. No deadlock under rendezvous semantics: a send completes only when the
//     peer has posted the matching receive, as with NCCL. The executor model
//     checked here is the one the workers implement: each rank has two
//     in-order communication streams, one for activations and one for
//     gradients (two NCCL communicators, or two TCP connections). On each
//     stream, the send of an action's output is posted as one group
//     (ncclGroupStart/End) with the next receive on that stream, once the
//     output is computed and the previous group has completed; an action runs
//     once the group holding its input has completed. Pairing each send with
//     the next receive is what lets two ranks that send to each other make
//     progress (Megatron's send_forward_recv_forward); splitting directions
//     keeps a blocked gradient send from holding up activations.
// Cross-rank order (F after the upstream F, ...) follows from 4 and 5.
// Pure functions; thread-safe.
#ifndef CONVEYOR_SCHEDULER_VALIDATOR_H_
#define CONVEYOR_SCHEDULER_VALIDATOR_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "scheduler/schedule.h"

namespace conveyor::scheduler {

struct ScheduleViolation {
  int rank = -1;   // -1 when the schedule's shape itself is wrong.
  int index = -1;  // Position in the rank's program; -1 for a missing action.
  Action action;   // The offending (or missing) action.
  std::string reason;
};

// "rank 2, action #3 (B2.0): <reason>".
std::string ToString(const ScheduleViolation& violation);

// The first violation, or nullopt for a valid schedule.
std::optional<ScheduleViolation> FindViolation(const Schedule& schedule);

// OK, or InvalidArgument carrying ToString(first violation).
absl::Status ValidateSchedule(const Schedule& schedule);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_VALIDATOR_H_
