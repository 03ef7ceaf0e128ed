// P2pChannel: a Channel over an in-order, rendezvous point-to-point
// communicator (NCCL; see communicator.h for its rules), with the tensors'
// headers announced over an ordered side channel (HeaderLink). NcclChannel
// (nccl_channel.h) is this over NCCL; tests run it over FakeCommunicator.
//
// Why headers: NCCL matches the i-th send to a peer with the peer's i-th
// receive and needs the byte count up front, while Channel::Recv asks by
// tag, in any order. So each tensor is announced (tag, dtype, shape, bytes)
// over the HeaderLink, in send order, and the receiving channel posts the
// receive itself, into a buffer it allocates, as soon as the announcement
// arrives; the finished tensor waits in a mailbox keyed by tag until Recv
// asks for it.
//
// Why rounds: a rank's NCCL groups run one after another. If two ranks each
// launch a group sending a large tensor to the other before either has
// seen the other's announcement, each send waits for a receive the other
// rank has queued behind its own blocked send: both hang (NCCL's send is a
// rendezvous beyond its internal buffers, and connection setup is one at
// any size). Grouping "whatever is pending" cannot prevent that, because
// what is pending differs between the ranks. So the ranks agree on the
// groups: communication proceeds in numbered rounds. A rank that has new
// sends proposes the next round: it sends each peer the headers of its
// sends to that peer in that round (possibly none). A rank that hears of a
// round proposes it too (with whatever it has pending, or nothing). Once a
// rank holds every peer's proposal for round k, it launches one group: its
// own sends of round k and a receive for every tensor announced to it in
// round k. Round k's group on each rank thus contains exactly the partners
// of the round-k groups of its peers, and groups launch in round order, so
// by induction every round completes (no rank ever waits on an operation
// queued behind a group that waits on it) whatever the order of Sends and
// Recvs, for any peer graph. The channel therefore behaves like the TCP and
// in-memory ones: a Send never waits and every sent tensor arrives, so any
// schedule that runs on them runs here (the schedule validator's rendezvous
// model, scheduler/validator.h, is stricter than this channel needs). Rounds
// cost one header message per peer and round, and a header round trip
// before a transfer starts. A round is proposed only for new sends (never
// polled), so a step has at most as many rounds as the job has sends, fewer
// when sends are batched.
//
// Ordering against compute: Send records a fence on the producer's stream
// (CUDA: an event on the compute stream) and returns; the group waits for
// it on the communication stream, so the host never waits for compute and
// compute never waits for communication. Received tensors are filed only
// once their group has completed, so a Recv'd tensor is ready for any
// stream.
//
// Failure: everything that goes wrong aborts the channel (the
// communicator is aborted, ncclCommAbort), fails every pending and future
// call with the status, and tells every peer over the HeaderLink, so every
// rank of the job fails with the original reason instead of hanging:
//   - a Recv timeout (DeadlineExceeded naming the rank, the tag and whether
//     and by whom it was announced), unless abort_on_recv_timeout is false;
//   - a stall: a launched group that makes no progress for stall_timeout,
//     or a round whose proposals do not all arrive within it
//     (DeadlineExceeded naming the peers and tags involved);
//   - the communicator's asynchronous error (a peer process died: as NCCL
//     reports it, e.g. Unavailable for a remote or system error);
//   - a broken HeaderLink to a peer (Unavailable naming the peer), a bad
//     message from a peer, or a peer's abort notice (its code, and its
//     message after "rank p aborted: ");
//   - Abort() called by the owner.
// A peer that closes its channel normally (destructor) says goodbye first;
// that is not a failure, but a later send to it is (FailedPrecondition).
//
// Thread-safe: Send, Recv, Abort and the accessors may be called from any
// thread. One progress thread drives the communicator.
#ifndef CONVEYOR_TRANSPORT_NCCL_P2P_CHANNEL_H_
#define CONVEYOR_TRANSPORT_NCCL_P2P_CHANNEL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/channel.h"
#include "transport/nccl/communicator.h"
#include "transport/nccl/header_link.h"

namespace conveyor::transport {

struct P2pChannelOptions {
  uint64_t job = 0;
  // The ranks this rank exchanges tensors with; empty means every other
  // rank. Must be symmetric across the job (r lists p iff p lists r): a
  // rank waits for a round proposal from every peer. Pipelines list their
  // neighbours (rank r-1 and r+1, wrapping around for interleaved
  // schedules).
  std::vector<int> peers;
  // The largest tensor sent or accepted.
  uint64_t max_tensor_bytes = uint64_t{1} << 36;
  // A Recv timeout means a tensor the schedule needs did not come: the job
  // cannot go on, so by default the channel aborts and tells its peers.
  bool abort_on_recv_timeout = true;
  // How long a launched group may go without completing, or a proposed
  // round without every peer's proposal, before the channel declares a
  // peer lost or hung and aborts.
  std::chrono::milliseconds stall_timeout{60000};
  // How long closing (destructor) may spend finishing the rounds already
  // proposed, and then on the communicator's orderly shutdown, and how long
  // an abort waits for the device to let go of in-flight buffers (they are
  // leaked rather than reused if it does not).
  std::chrono::milliseconds linger{10000};
  // Optional; outlives the channel. Told from the progress thread (a
  // receive timeout from the receiving thread).
  DataPlaneObserver* observer = nullptr;
};

// The peer list a channel uses: `peers` sorted, or every other rank when it
// is empty. InvalidArgument for a rank outside [0, world_size), the own
// rank, or a rank listed twice.
absl::StatusOr<std::vector<int>> ResolvePeers(int rank, int world_size,
                                              const std::vector<int>& peers);

class P2pChannel final : public Channel {
 public:
  // Starts the progress thread and the header link. `comm` gives the rank
  // and world size; `link` outlives the channel; the backend of the
  // tensors outlives it too. InvalidArgument for a bad peer list (out of
  // range, self, duplicates) or a null link.
  static absl::StatusOr<std::unique_ptr<P2pChannel>> Create(
      std::unique_ptr<CommunicatorInterface> comm, HeaderLink* link,
      const P2pChannelOptions& options);

  // Finishes the rounds already proposed (at most options.linger), says
  // goodbye to the peers, shuts the communicator down (aborting it if that
  // does not finish in time) and joins the progress thread.
  ~P2pChannel() override;

  P2pChannel(const P2pChannel&) = delete;
  P2pChannel& operator=(const P2pChannel&) = delete;

  // Channel. Send also returns InvalidArgument for a destination that is
  // neither this rank nor a peer, a tag of another job, a negative tag
  // field, an undefined tensor, more than 8 dimensions or more than
  // max_tensor_bytes, and PrepareSend's errors (a tensor of another
  // device). Sending to the own rank files the tensor (shared, not copied)
  // in the own mailbox.
  absl::Status Send(int to, const Tag& tag,
                    const engine::Tensor& tensor) override;
  absl::StatusOr<engine::Tensor> Recv(
      const Tag& tag, std::chrono::milliseconds timeout) override;
  void Abort(const absl::Status& status) override;

  // OK, or the status the channel was aborted with.
  absl::Status status() const;

  struct Stats {
    int64_t rounds = 0;    // Rounds launched.
    int64_t groups = 0;    // Groups handed to the communicator.
    int64_t sent = 0;      // Tensors whose send completed.
    int64_t received = 0;  // Tensors filed in the mailbox from peers.
  };
  Stats stats() const;

 private:
  class Impl;
  explicit P2pChannel(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_NCCL_P2P_CHANNEL_H_
