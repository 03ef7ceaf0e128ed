#include "transport/nccl/internal/poll_pacer.h"

#include <algorithm>

namespace conveyor::transport::p2p_internal {

absl::Duration PollPacer::Next(bool in_flight, bool waiting) {
  if (in_flight) {
    poll_ = progressed_ ? kMinPoll : std::min(poll_ * 2, kMaxPoll);
    progressed_ = false;
    return poll_;
  }
  if (waiting) return kStallCheck;
  return kIdleCheck;
}

}  // namespace conveyor::transport::p2p_internal
