// TcpChannel::Impl: the channel's state and its caller-facing API
// (tcp_channel.cc), owning and wiring the parts in internal/: the Dialer
// opens and watches the send-side connections, the Writer writes their
// frames, the Reader accepts and reads the receive-side ones, and the
// MessageInbox holds the control messages. The Impl decides what the parts
// report: it keeps the abort status and the mailbox, judges a lost peer,
// and runs abort and close. Internal: only tcp_channel.cc includes it.
//
// Threading: see tcp_channel.h; every member marked "I/O thread only" is
// touched by that thread alone, and so are the Owner methods the parts call
// (except Fail, Observe and Deliver, which any thread may call).
#ifndef CONVEYOR_TRANSPORT_TCP_TCP_CHANNEL_IMPL_H_
#define CONVEYOR_TRANSPORT_TCP_TCP_CHANNEL_IMPL_H_

#include <asio.hpp>  // io_context, executor_work_guard, steady_timer
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "transport/mailbox.h"
#include "transport/tcp/internal/dialer.h"
#include "transport/tcp/internal/message_inbox.h"
#include "transport/tcp/internal/out_link.h"
#include "transport/tcp/internal/reader.h"
#include "transport/tcp/internal/writer.h"
#include "transport/tcp/tcp_channel.h"

namespace conveyor::transport {

class TcpChannel::Impl final : private tcp_internal::Dialer::Owner,
                               private tcp_internal::Writer::Owner,
                               private tcp_internal::Reader::Owner {
 public:
  using tcp = asio::ip::tcp;
  using Clock = std::chrono::steady_clock;

  Impl(const TcpChannelConfig& config, engine::Backend* backend);

  ~Impl() override;

  absl::Status Listen();

  uint16_t port() const;

  absl::Status Connect(const std::vector<std::string>& peers);

  absl::Status Send(int to, const Tag& tag, const engine::Tensor& tensor);

  absl::Status SendMessage(int to, std::string message);

  absl::StatusOr<std::string> TakeMessage(int from,
                                          std::chrono::milliseconds timeout);

  void SetMessageHandler(MessageHandler* handler);

  absl::StatusOr<engine::Tensor> Recv(const Tag& tag,
                                      std::chrono::milliseconds timeout);

  // Counts a failure this channel observed itself; the connections that
  // close after an abort (its own or a peer's) are consequences, not news.
  void Observe(DataPlaneObserver::Error error) override
      ABSL_LOCKS_EXCLUDED(mu_);

  void Fail(const absl::Status& status) override ABSL_LOCKS_EXCLUDED(mu_);

  int64_t rejected_connections() const;

  absl::Status status() const;

 private:
  using OutLink = tcp_internal::OutLink;
  using OutFrame = tcp_internal::OutFrame;

  // --- Shared state ---------------------------------------------------------

  void SetAbortStatus(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status Deliver(const Tag& tag, engine::Tensor tensor, int from) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- I/O thread: what the parts report ------------------------------------

  std::string Peer(int rank, absl::string_view fallback_address) const override;

  void OnConnected(OutLink* l) override ABSL_LOCKS_EXCLUDED(mu_);

  // The send side to a peer broke. Unless the peer said goodbye with nothing
  // left to send to it, the job lost a rank; give its own abort frame, if
  // any, a moment to arrive first.
  void OnLinkLost(OutLink* l, const asio::error_code& ec) override;

  void OnLinkClosed() override { MaybeFinishClose(); }

  void OnMessage(int from, std::string message) override;

  // No more direct writes to `rank`, and nothing more but messages dropped.
  void OnGoodbye(int rank) override;

  bool SaidGoodbye(int rank) const override { return said_goodbye_[rank]; }

  bool Ending() const override { return abort_handled_ || closing_; }

  bool Closing() const override { return closing_; }

  // Reports `reason` (the loss of `l`'s peer) after kPeerLossGrace, unless
  // the peer said goodbye meanwhile. While the peer's connection to this
  // rank is still open its own end decides (its abort frame, queued behind
  // frames it is still sending, or the end of the stream), so the report
  // waits, until `give_up`.
  void ReportLossAfterGrace(OutLink* l, bool undelivered, std::string reason,
                            Clock::time_point give_up);

  // --- I/O thread: abort and close ------------------------------------------

  // Tells every connected peer why, then closes. A frame being written is
  // finished first (the stream would be garbage otherwise); queued ones are
  // dropped.
  void OnAbort(const absl::Status& status);

  // Destructor: flush what was sent, then a goodbye on each connection.
  void BeginClose();

  void ArmLinger();

  void CloseInbound();

  // Once every send-side connection is closed, closes the rest and lets the
  // I/O thread's run() return.
  void MaybeFinishClose();

  // When our send-side connection to a peer fails, the peer's abort or goodbye
  // frame may still be on its way over the other connection (the two sockets
  // are read in no particular order). Waiting this long before declaring the
  // peer lost lets the peer's own reason win.
  static constexpr std::chrono::milliseconds kPeerLossGrace{100};

  // Whether `backend`'s tensors live in host memory, so the I/O thread may
  // read and write them in place.
  static bool IsHost(engine::Backend* backend);

  const TcpChannelConfig config_;
  engine::Backend* const backend_;
  uint16_t port_ = 0;

  // Declared before the sockets and timers so it is destroyed after them.
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>>
      work_;

  // The parts; each keeps references to config_, io_ and this.
  tcp_internal::Writer writer_;
  tcp_internal::Dialer dialer_;
  tcp_internal::Reader reader_;  // Owns the acceptor and inbound sockets.
  tcp_internal::MessageInbox inbox_;

  // I/O thread only (set up before the thread starts).
  asio::steady_timer linger_timer_;
  std::vector<std::unique_ptr<OutLink>> out_;  // By rank; own entry unused.
  std::vector<bool> said_goodbye_;             // By rank.
  std::vector<std::string> peer_addresses_;
  bool abort_handled_ = false;
  bool closing_ = false;
  bool finished_ = false;
  bool linger_armed_ = false;

  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  Mailbox mailbox_ ABSL_GUARDED_BY(mu_);
  bool connect_called_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  int connects_pending_ ABSL_GUARDED_BY(mu_) = 0;

  // Last member: started last, joined first (in ~Impl).
  std::thread thread_;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_TCP_TCP_CHANNEL_IMPL_H_
