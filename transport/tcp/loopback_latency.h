// What one small tensor takes from rank to rank over the TCP data plane on
// this machine: two TcpChannels on 127.0.0.1 in this process, a 4-byte
// tensor sent after an idle pause (as a pipeline's sends come, a compute
// action apart), timed to its Recv. The planner charges this to every
// simulated transfer (job/planner.h ChooseStages), which decides between
// schedules when layers take a millisecond or less. Across machines the
// network adds to it; this is the floor every transfer pays.
//
// Thread-safe (each call owns its channels).
#ifndef CONVEYOR_TRANSPORT_TCP_LOOPBACK_LATENCY_H_
#define CONVEYOR_TRANSPORT_TCP_LOOPBACK_LATENCY_H_

#include <chrono>

#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace conveyor::transport {

// The median over `samples` (1..1000) transfers of a tensor of `backend`
// (whose memory the channels send from and receive into), in seconds, each
// after `idle` (0..100 ms) without traffic. InvalidArgument for options out
// of range; the channels' errors (Unavailable when loopback cannot be
// bound).
absl::StatusOr<double> MeasureLoopbackLatency(engine::Backend* backend,
                                              int samples,
                                              std::chrono::milliseconds idle);

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_TCP_LOOPBACK_LATENCY_H_
