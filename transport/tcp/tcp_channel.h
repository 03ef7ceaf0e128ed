// TcpChannel: a rank's Channel endpoint when the ranks of a job run in
// different processes, over TCP (standalone Asio). The wire format is in
// transport/tcp/frame.h.
//
// Setup is two-phase so that every rank can listen on a free port before
// anyone dials: Create() binds and listens (port 0 picks a free port, see
// port()) and starts the I/O thread; Connect() dials every other rank, opens
// one connection per ordered pair (sender -> receiver), and returns once
// each peer has accepted the handshake (magic, version, job, ranks, and the
// job's secret, which the acceptor compares in constant time). Connections
// a rank rejects are logged and counted (rejected_connections()); they
// never disturb the job.
//
// Data path. Send validates, then hands the tensor to the I/O thread and
// returns: it never waits for the network. A small frame (at most
// direct_write_max_bytes) to a peer whose connection is idle (nothing queued,
// being written or on its way to the I/O thread) is written by Send itself,
// without blocking (MSG_DONTWAIT): waking the sleeping I/O thread cost more
// than the write (see docs/bubble.md, "Wake-up latency"); whatever the
// kernel does not take at once goes to the I/O thread, ahead of anything
// else on that connection, so frames never interleave or reorder. A CPU
// tensor is not copied; the
// queue holds a handle to it until the kernel has taken the bytes (senders
// never modify a tensor after sending it, as with InMemoryHub). Header and
// payload go out in one gather write. The receiver validates the whole
// header first, then allocates exactly the announced size on the CPU backend
// and reads the payload straight into it: the kernel's copy is the only one.
// Tensors of a non-CPU backend are staged through host memory on the
// caller's thread (Send copies to host; Recv copies to the channel's
// backend), because only the thread driving a backend may use it.
//
// Failure. Everything that goes wrong aborts the channel, and an aborted
// channel tells every connected peer why (an abort frame) before it closes,
// so one failure stops every worker with the original reason:
//   - a Recv timeout (DeadlineExceeded naming the rank and tag), unless
//     abort_on_recv_timeout is false;
//   - a peer whose connection ends without a goodbye (Unavailable naming the
//     peer's rank and address): a killed process is noticed as soon as its
//     kernel closes the socket, not at the next timeout. A peer that aborts
//     closes its inbound side at once while its abort frame still waits
//     behind what it is sending; as long as its connection to this rank
//     stays open, that frame (with the peer's reason) decides;
//   - a malformed or oversized frame from a connected peer (DataLoss,
//     InvalidArgument or FailedPrecondition naming the peer and the field);
//   - Abort() called by the owner.
// A peer that closes its channel normally (destructor) sends a goodbye
// first; that is not a failure.
//
// Thread-safe: Send, Recv, Abort and the accessors may be called from any
// thread; Connect once, from one thread. All socket work happens on the one
// I/O thread, except the direct writes of small frames above.
#ifndef CONVEYOR_TRANSPORT_TCP_TCP_CHANNEL_H_
#define CONVEYOR_TRANSPORT_TCP_TCP_CHANNEL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "transport/channel.h"

namespace conveyor::transport {

struct TcpChannelConfig {
  int rank = 0;
  int world_size = 1;  // Number of ranks in the job.
  // "host:port" (IPv6 as "[::1]:port") to listen on; port 0 picks a free one.
  std::string listen_address = "127.0.0.1:0";
  uint64_t job = 0;
  // 1 to 64 bytes, the same on every rank of the job: the job's secret, or
  // in a cluster with an auth token the DataPlaneSecret derived from both
  // (common/auth_token.h).
  std::string secret;
  // How long Connect keeps dialing a peer that is not listening yet, and how
  // long an accepted connection may take to complete its handshake.
  std::chrono::milliseconds connect_timeout{10000};
  // The largest tensor payload accepted from a peer (and sent): bounds what
  // a peer can make this rank allocate.
  uint64_t max_frame_bytes = uint64_t{1} << 30;
  // A Recv timeout means a tensor the schedule needs did not come: the job
  // cannot go on, so by default the channel aborts and tells its peers.
  bool abort_on_recv_timeout = true;
  // How long closing (destructor) or aborting may spend flushing queued
  // frames to slow peers before the sockets are closed regardless.
  std::chrono::milliseconds linger{2000};
  // Frames (header and payload) up to this size are written by Send itself
  // when their connection is idle; 0 leaves every write to the I/O thread.
  // Small, because a large payload's copy into the kernel is better done
  // off the caller's (compute) thread, and its wake-up cost is negligible
  // next to it.
  uint64_t direct_write_max_bytes = 256 * 1024;
  // Optional; outlives the channel.
  DataPlaneObserver* observer = nullptr;
};

class TcpChannel final : public Channel {
 public:
  // Binds and listens on config.listen_address and starts the I/O thread.
  // `backend` receives the tensors Recv returns; it outlives the channel.
  // InvalidArgument for a bad config (rank outside [0, world_size), secret
  // empty or over 64 bytes, unparsable address); Unavailable when the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<TcpChannel>> Create(
      const TcpChannelConfig& config, engine::Backend* backend);

  // Flushes queued sends (at most config.linger), says goodbye to the peers,
  // closes every socket and joins the I/O thread.
  ~TcpChannel() override;

  TcpChannel(const TcpChannel&) = delete;
  TcpChannel& operator=(const TcpChannel&) = delete;

  // The port the channel listens on (the chosen one when configured as 0).
  uint16_t port() const;

  // Connects to every other rank; peers[r] is rank r's "host:port" (the own
  // entry is ignored). Retries refused connections until connect_timeout,
  // since peers start at different times. On failure the channel is aborted
  // with the returned status:
  //   InvalidArgument: wrong number of peers, unparsable address;
  //   PermissionDenied: a peer rejected the secret (another job's, or one
  //     derived from another auth token);
  //   FailedPrecondition: a peer runs another job or protocol version, or
  //     Connect was already called;
  //   DeadlineExceeded: a peer did not accept within connect_timeout;
  //   the abort status if the channel was aborted meanwhile.
  absl::Status Connect(const std::vector<std::string>& peers);

  // Channel. Send additionally returns FailedPrecondition before Connect,
  // and InvalidArgument for a tag of another job, a negative tag field, an
  // undefined tensor, more than 8 dimensions or more than max_frame_bytes.
  // Sending to the own rank delivers to the own mailbox.
  absl::Status Send(int to, const Tag& tag,
                    const engine::Tensor& tensor) override;
  absl::StatusOr<engine::Tensor> Recv(
      const Tag& tag, std::chrono::milliseconds timeout) override;
  void Abort(const absl::Status& status) override;

  // Control messages: small opaque byte strings (at most kMaxMessageBytes,
  // frame.h) for a peer, written on the same connection as its tensors and
  // so in order with them. The NCCL channel announces its tensors this way
  // (tcp_header_link.h) while the payloads travel over NCCL.
  class MessageHandler {
   public:
    virtual ~MessageHandler() = default;
    // A message from rank `from`; messages from one rank come in order.
    virtual void OnMessage(int from, std::string message) = 0;
    // The channel failed (aborted, or a peer was lost): nothing more comes.
    // Called once, after every message that arrived before.
    virtual void OnChannelFailed(const absl::Status& status) = 0;
  };
  // Queues `message` for rank `to` (not the own rank). Errors as Send's, and
  // InvalidArgument for a message over kMaxMessageBytes.
  absl::Status SendMessage(int to, std::string message);
  // Takes the first message from rank `from` that arrived and is not yet
  // delivered, waiting at most `timeout`; only while no handler is set (a
  // handler takes messages as they come). How rank 0 hands out the NCCL id
  // before the ranks start their header links. DeadlineExceeded after
  // `timeout`; the channel's status once it failed.
  absl::StatusOr<std::string> TakeMessage(int from,
                                          std::chrono::milliseconds timeout);
  // Starts delivering to `handler` (first what arrived before, then a
  // failure that happened before), on the I/O thread; nullptr stops, and
  // returns only once no callback runs any more. Callbacks must be quick
  // and must not call SetMessageHandler.
  void SetMessageHandler(MessageHandler* handler);

  // Connections refused at the handshake (garbage, wrong secret, job,
  // version or rank, duplicates, handshake timeouts) since Create.
  int64_t rejected_connections() const;
  // OK, or the status the channel was aborted with.
  absl::Status status() const;

 private:
  class Impl;
  explicit TcpChannel(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_TCP_TCP_CHANNEL_H_
