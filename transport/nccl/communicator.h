// CommunicatorInterface: the point-to-point transport a P2pChannel drives.
// The real one is NCCL (transport/nccl/nccl_communicator.h); tests use
// FakeCommunicator (transport/nccl/fake_communicator.h), which keeps NCCL's
// rules strictly, on the CPU.
//
// NCCL's rules, which every implementation keeps:
//  - Operations are launched in groups. A rank's groups run one after
//    another, in launch order; the operations of one group progress
//    together.
//  - Between an ordered pair of ranks, the i-th send matches the i-th
//    receive, by position alone; both must have the same byte count.
//  - Rendezvous: a send may not complete before the matching receive runs,
//    and a receive not before the matching send runs. Two ranks whose
//    groups each wait for an operation the other has queued behind the
//    group it is running wait forever. P2pChannel's rounds
//    (p2p_channel.h) are what rule that out.
//
// Thread-safety: PrepareSend and Interrupt may be called from any thread
// (PrepareSend by Send's caller, the thread that drives the tensor's
// backend); every other method from the channel's progress thread only.
#ifndef CONVEYOR_TRANSPORT_NCCL_COMMUNICATOR_H_
#define CONVEYOR_TRANSPORT_NCCL_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/dtype.h"
#include "engine/tensor.h"

namespace conveyor::transport {

// A point in the producer's work (on CUDA: an event recorded on the compute
// stream) after which a send's payload is complete. Opaque to the channel.
class ComputeFence {
 public:
  virtual ~ComputeFence() = default;
};

// A tensor ready to hand to Launch as a send.
struct PreparedSend {
  engine::Tensor tensor;                // On the communicator's device.
  std::shared_ptr<ComputeFence> fence;  // Null when nothing needs waiting for.
};

struct P2pOp {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind = Kind::kSend;
  int peer = 0;
  // kSend: the payload (PreparedSend::tensor); kRecv: a buffer from
  // AllocateRecv, filled once the group completes. Never empty: the channel
  // does not launch zero-byte operations.
  engine::Tensor tensor;
  std::shared_ptr<ComputeFence> fence;  // kSend: PreparedSend::fence.
};

inline P2pOp SendOp(int peer, engine::Tensor tensor,
                    std::shared_ptr<ComputeFence> fence = nullptr) {
  P2pOp op;
  op.kind = P2pOp::Kind::kSend;
  op.peer = peer;
  op.tensor = std::move(tensor);
  op.fence = std::move(fence);
  return op;
}

inline P2pOp RecvOp(int peer, engine::Tensor tensor) {
  P2pOp op;
  op.kind = P2pOp::Kind::kRecv;
  op.peer = peer;
  op.tensor = std::move(tensor);
  return op;
}

class CommunicatorInterface {
 public:
  virtual ~CommunicatorInterface() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // `tensor` as the communicator sends it (a copy on its device when the
  // tensor lives elsewhere), and the fence after the work producing it.
  // Never waits for that work. InvalidArgument for a tensor it cannot send
  // (another device's); ResourceExhausted when a copy does not fit.
  virtual absl::StatusOr<PreparedSend> PrepareSend(
      const engine::Tensor& tensor) = 0;

  // A buffer to receive `shape`/`dtype` into. ResourceExhausted when out of
  // memory.
  virtual absl::StatusOr<engine::Tensor> AllocateRecv(
      const engine::Shape& shape, engine::DType dtype) = 0;

  // Enqueues `ops` as one group behind the groups launched before (after
  // each send's fence), without waiting for it; returns the id to Poll. The
  // caller keeps every tensor referenced until Poll says done (or until
  // Quiescent after Abort). Errors: the communicator's failure (the channel
  // aborts); DeadlineExceeded if the launch itself could not finish within
  // the communicator's launch timeout.
  virtual absl::StatusOr<uint64_t> Launch(const std::vector<P2pOp>& ops) = 0;

  // Whether group `id` has completed: its receive buffers hold the data and
  // its send buffers are free. An error if the communicator failed.
  virtual absl::StatusOr<bool> Poll(uint64_t id) = 0;

  // OK, or the asynchronous error the communicator hit (a peer process
  // died, a network error): from then on nothing launched will complete.
  virtual absl::Status AsyncError() = 0;

  // Stops every outstanding operation at once (ncclCommAbort). Afterwards
  // only Quiescent may be called.
  virtual void Abort() = 0;

  // Any thread: the channel is failing, so a Launch blocked in NCCL's
  // connection setup returns Cancelled now instead of at its deadline (the
  // progress thread then aborts). A cancel must not wait out the stall
  // timeout. Implementations that never block need nothing.
  virtual void Interrupt() {}

  // After Abort: whether the device can no longer touch the buffers of
  // groups that never completed, so they may be freed.
  virtual bool Quiescent() = 0;

  // Orderly shutdown once every launched group completed (ncclCommFinalize,
  // then destroy). DeadlineExceeded if that takes longer than `timeout`, in
  // which case the communicator is aborted instead.
  virtual absl::Status Close(std::chrono::milliseconds timeout) = 0;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_NCCL_COMMUNICATOR_H_
