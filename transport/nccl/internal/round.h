// The pieces of a P2pChannel round (p2p_channel.h, "Why rounds"), from a
// Send accepted to a launched group: OutgoingSend, ProposedRound, Received
// and InFlight, and Describe, which names a round's operations in error
// messages. Plain data; the channel's progress thread owns them.
#ifndef CONVEYOR_TRANSPORT_NCCL_INTERNAL_ROUND_H_
#define CONVEYOR_TRANSPORT_NCCL_INTERNAL_ROUND_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "transport/channel.h"
#include "transport/nccl/communicator.h"
#include "transport/tensor_header.h"

namespace conveyor::transport::p2p_internal {

using Clock = std::chrono::steady_clock;

// A Send accepted but not yet proposed (the channel's outbox), or proposed
// in a round not yet launched, or in flight.
struct OutgoingSend {
  int to;
  TensorHeader header;
  PreparedSend payload;
  Clock::time_point queued_at;  // When Send accepted it.
};

// A round this rank proposed and has not launched yet.
struct ProposedRound {
  uint64_t round;
  std::vector<OutgoingSend> sends;
  Clock::time_point proposed_at;
};

struct Received {
  Tag tag;
  int from;
  engine::Tensor tensor;
};

// A launched round. Holds every tensor of its group until it completes:
// the communication stream still reads the sends and writes the
// receives.
struct InFlight {
  uint64_t round = 0;
  std::optional<uint64_t> group;  // None: nothing to transfer.
  std::vector<OutgoingSend> sends;
  std::vector<Received> receives;
};

// At most this many operations are named in Describe.
inline constexpr size_t kDescribedOps = 4;

// "send the activation of ... to rank 2, receive the gradient of ... from
// rank 2", the first kDescribedOps, then "and N more"; "nothing" for an
// empty round.
std::string Describe(const InFlight& f);

}  // namespace conveyor::transport::p2p_internal

#endif  // CONVEYOR_TRANSPORT_NCCL_INTERNAL_ROUND_H_
