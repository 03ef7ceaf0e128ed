// Channel: a rank's endpoint on the data plane, moving activations and
// gradients between pipeline stages.
//
// Send never blocks compute: the tensor is queued and delivered by the
// implementation (a shared mailbox in one process, an I/O thread over TCP).
// Recv waits for the tensor with a given tag, at most `timeout`. Abort fails
// every pending and future call on this endpoint with the given status, so a
// rank that learns the job is lost stops waiting at once.
//
// Tags name a tensor uniquely within a job: which step, microbatch and
// producing stage, and whether it is an activation (flowing forward to
// stage+1) or a gradient (flowing back to stage-1). Receivers ask by tag, so
// tensors may arrive in any order.
//
// Thread-safe: Send, Recv and Abort may be called from different threads.
#ifndef CONVEYOR_TRANSPORT_CHANNEL_H_
#define CONVEYOR_TRANSPORT_CHANNEL_H_

#include <chrono>
#include <compare>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tensor.h"

namespace conveyor::transport {

enum class TensorKind : uint8_t {
  kActivation = 0,
  kGradient = 1,
  // A rank's share of a step-wide sum: not a pipeline tensor, so `stage`
  // holds the sending rank and `microbatch` says which sum: 0 the squared
  // gradient norm (for clipping), 1 + i the gradient of the model's tied
  // parameter i and 1 + n + i (of n) the checksum of its values
  // (worker/stage_executor.h). Its own kind keeps it apart from every
  // stage's tensors, and names it in errors.
  kPartialSum = 2,
  // An evaluation's activation (engine/evaluation.h): `step` is the
  // training step the evaluation follows and `microbatch` its index in the
  // evaluation, [0, K*M). Its own kind keeps the evaluation's tensors apart
  // from the next training step's, which a rank done evaluating may already
  // be sending.
  kEvalActivation = 3,
};

struct Tag {
  uint64_t job = 0;
  int64_t step = 0;
  int32_t microbatch = 0;
  int32_t stage = 0;  // The producing stage (kPartialSum: the sending rank).
  TensorKind kind = TensorKind::kActivation;

  friend auto operator<=>(const Tag&, const Tag&) = default;
};

// "activation of stage 2, step 5, microbatch 3 (job 7)"; "gradient-norm
// partial sum of rank 1, step 5 (job 7)"; "partial sum 2 (tied parameter) of
// rank 1, step 5 (job 7)".
std::string ToString(const Tag& tag);

// Told about a channel's traffic and failures, for metrics, whatever moves
// the tensors (TCP, NCCL). Most calls come from the channel's own thread (an
// I/O or progress thread), a receive timeout's from the receiving thread:
// implementations must be thread-safe, quick, and must not call back into
// the channel.
class DataPlaneObserver {
 public:
  enum class Error {
    kTimeout,   // A Recv timed out.
    kPeerLost,  // A peer's connection ended without a goodbye.
    kBadFrame,  // A connected peer sent a malformed or oversized tensor.
    kRejected,  // A connection was refused at the handshake.
  };
  virtual ~DataPlaneObserver() = default;
  // A tensor of `bytes` left for rank `peer`: its transfer completed `took`
  // after Send queued it (TCP: the kernel took its last byte; NCCL: its
  // group completed).
  virtual void OnSent(int peer, uint64_t bytes,
                      std::chrono::steady_clock::duration took) = 0;
  virtual void OnReceived(int peer, uint64_t bytes) = 0;
  virtual void OnError(Error error) = 0;
};

class Channel {
 public:
  virtual ~Channel() = default;

  // Queues `tensor` for rank `to`. Returns the abort status after Abort, or
  // an error if `to` is not a peer; never waits for the receiver.
  virtual absl::Status Send(int to, const Tag& tag,
                            const engine::Tensor& tensor) = 0;

  // The tensor with `tag`, once it has arrived. DeadlineExceeded after
  // `timeout` (naming the tag), or the abort status after Abort.
  virtual absl::StatusOr<engine::Tensor> Recv(
      const Tag& tag, std::chrono::milliseconds timeout) = 0;

  // Fails pending and future calls on this endpoint with `status`.
  virtual void Abort(const absl::Status& status) = 0;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_CHANNEL_H_
