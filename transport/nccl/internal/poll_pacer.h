// PollPacer: how long a P2pChannel's progress thread waits for new work
// before its next turn. While groups are in flight it polls the
// communicator: every kMinPoll right after progress, backing off to kMaxPoll
// while nothing completes. The back-off bounds the thread's CPU use on long
// transfers; kMaxPoll bounds the delay it adds to noticing a completion.
// Otherwise it wakes often enough to check stalls, or, idle, to notice the
// communicator's asynchronous error.
//
// Not thread-safe: the progress thread owns it.
#ifndef CONVEYOR_TRANSPORT_NCCL_INTERNAL_POLL_PACER_H_
#define CONVEYOR_TRANSPORT_NCCL_INTERNAL_POLL_PACER_H_

#include "absl/time/time.h"

namespace conveyor::transport::p2p_internal {

class PollPacer {
 public:
  static constexpr absl::Duration kMinPoll = absl::Microseconds(10);
  static constexpr absl::Duration kMaxPoll = absl::Microseconds(500);
  // How often stalls are checked while waiting for headers or for closing.
  static constexpr absl::Duration kStallCheck = absl::Milliseconds(10);
  // How often an idle channel polls the communicator's asynchronous error,
  // so that a peer lost while nothing is in flight is noticed promptly too.
  static constexpr absl::Duration kIdleCheck = absl::Milliseconds(100);

  // The wait before the next turn: `in_flight` while groups are launched and
  // not completed; else `waiting` while rounds wait for headers or the
  // channel is closing.
  absl::Duration Next(bool in_flight, bool waiting);

  // A group was launched or completed since the last Next.
  void Progressed() { progressed_ = true; }

 private:
  absl::Duration poll_ = kMinPoll;
  bool progressed_ = false;
};

}  // namespace conveyor::transport::p2p_internal

#endif  // CONVEYOR_TRANSPORT_NCCL_INTERNAL_POLL_PACER_H_
