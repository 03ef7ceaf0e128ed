// DrainGate: how the ranks of a job agree on the step to stop after when a
// worker is drained (conveyorctl drain, or the worker's SIGTERM), so that
// every rank checkpoints the same step and none has begun the next.
//
// The coordinator asks every rank for its drain point (RequestStop: the step
// whose end is the rank's next step boundary), takes the largest answer D,
// and tells every rank to stop after D (StopAfter). From its RequestStop on,
// a rank waits at each step boundary until it hears D: it cannot pass the
// boundary it reported, and D is at least that boundary, so no rank is ever
// past D when D arrives. A rank that waits has finished its part of its
// step; the others finish theirs without it, and the wait lasts one round
// trip to the coordinator.
//
//   DrainGate gate;
//   gate.Begin(first_step);                 // Run, before the first step.
//   ... after step `done`:
//   ASSIGN_OR_RETURN(bool stop, gate.AtBoundary(done, last_step, cancel));
//   if (stop) { checkpoint(done); return; }
//
// Thread-safety: Begin and AtBoundary from the job thread; RequestStop and
// StopAfter from any thread (the session's reading thread).
#ifndef CONVEYOR_WORKER_DRAIN_GATE_H_
#define CONVEYOR_WORKER_DRAIN_GATE_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cancellation.h"

namespace conveyor::worker {

class DrainGate {
 public:
  // The next boundary is the end of `step` (the first step Run runs).
  void Begin(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // Asks to stop: returns the step whose end is the next boundary, and
  // holds every boundary from then on until StopAfter.
  int64_t RequestStop() ABSL_LOCKS_EXCLUDED(mu_);

  // Stop after `step`, which is at least what RequestStop answered. A later
  // call does not move it.
  void StopAfter(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // At the end of step `done`: whether to stop after it. Waits while a stop
  // is requested and its step not yet known, until `cancellation` is
  // cancelled (then false: the caller sees the cancel). Never stops at
  // `last_step`, where the job ends anyway. Internal error for a stop step
  // already behind us (a coordinator that broke the protocol).
  absl::StatusOr<bool> AtBoundary(int64_t done, int64_t last_step,
                                  const Cancellation& cancellation)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The step the job stopped after (AtBoundary answered true); 0: none.
  int64_t stopped_after() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  int64_t next_boundary_ ABSL_GUARDED_BY(mu_) = 1;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  int64_t stop_after_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not decided.
  int64_t stopped_after_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_DRAIN_GATE_H_
