// CoordinatorStreamInterface: the worker's one bidirectional stream to the
// coordinator (conveyor.v1.WorkerSession.Session), as WorkerSession
// (worker/session.h) drives it; CoordinatorDialerInterface opens one per
// connection attempt. The real ones are gRPC's
// (worker/grpc_coordinator_stream.h); tests use FakeCoordinatorDialer
// (tests/worker/fake_coordinator_stream.h), which needs no sockets.
//
// Thread-safety: one thread may Read while another Writes or calls
// WritesDone (the caller serializes its writes: one outstanding write per
// stream, as gRPC requires); Cancel may be called from any thread, at any
// time until the stream is destroyed; Finish after Read has returned false.
#ifndef CONVEYOR_WORKER_COORDINATOR_STREAM_H_
#define CONVEYOR_WORKER_COORDINATOR_STREAM_H_

#include <memory>

#include "absl/status/status.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::worker {

class CoordinatorStreamInterface {
 public:
  virtual ~CoordinatorStreamInterface() = default;

  // Blocks for the coordinator's next message; false at the end of the
  // stream (closed by the coordinator, broken, never connected, or
  // cancelled): then Finish says why.
  virtual bool Read(v1::CoordinatorMessage* message) = 0;

  // Sends `message`; false once the stream is broken (Read will then return
  // false, and Finish say why).
  virtual bool Write(const v1::WorkerMessage& message) = 0;

  // Half-closes the stream: the coordinator sees the end of our messages.
  // No Write may follow.
  virtual void WritesDone() = 0;

  // After Read returned false: how the call ended, gRPC's status mapped one
  // to one (proto::FromGrpcStatus). OK when the coordinator closed it;
  // Cancelled after Cancel; Unavailable when it could not be reached;
  // FailedPrecondition or Unauthenticated when it refused the registration.
  virtual absl::Status Finish() = 0;

  // Ends the call from any thread: a blocked Read (or a connection attempt
  // still under way) returns false at once.
  virtual void Cancel() = 0;
};

class CoordinatorDialerInterface {
 public:
  virtual ~CoordinatorDialerInterface() = default;

  // A new stream to the coordinator, one per connection attempt. Does not
  // block and cannot fail here: a coordinator that cannot be reached shows
  // as a stream whose Read returns false and whose Finish says why.
  virtual std::unique_ptr<CoordinatorStreamInterface> Open() = 0;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_COORDINATOR_STREAM_H_
