// TcpChannel::Impl, for the files that implement it (tcp_channel*.cc):
// the caller-facing API and shared state (tcp_channel.cc), dialing
// (tcp_channel_dial.cc), writing, abort and close (tcp_channel_write.cc),
// accepting and reading (tcp_channel_read.cc). Internal: nothing else
// includes it. Threading: see tcp_channel.h; every member marked "I/O
// thread only" is touched by that thread alone.
#ifndef CONVEYOR_TRANSPORT_TCP_TCP_CHANNEL_IMPL_H_
#define CONVEYOR_TRANSPORT_TCP_TCP_CHANNEL_IMPL_H_

#include <sys/socket.h>  // sendmsg
#include <sys/uio.h>     // iovec

#include <algorithm>
#include <array>
#include <asio.hpp>  // io_context, ip::tcp, steady_timer, async_read/write
#include <atomic>
#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log_rate_limiter.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "transport/mailbox.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_channel.h"

namespace conveyor::transport {

class TcpChannel::Impl {
 public:
  using tcp = asio::ip::tcp;
  using Clock = std::chrono::steady_clock;

  Impl(const TcpChannelConfig& config, engine::Backend* backend)
      : config_(config),
        backend_(backend),
        acceptor_(io_),
        accept_retry_(io_),
        linger_timer_(io_),
        said_goodbye_(config.world_size, false),
        in_connected_(config.world_size, false),
        peer_addresses_(config.world_size),
        mailbox_(config.rank) {
    for (int r = 0; r < config.world_size; ++r) {
      out_.push_back(std::make_unique<OutLink>(io_, r));
    }
  }

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      if (status_.ok()) {
        status_ = absl::CancelledError(
            absl::StrCat("rank ", config_.rank, " closed its channel"));
      }
    }
    if (thread_.joinable()) {
      asio::post(io_, [this] { BeginClose(); });
      thread_.join();
    }
  }

  absl::Status Listen();

  uint16_t port() const;

  absl::Status Connect(const std::vector<std::string>& peers);

  absl::Status Send(int to, const Tag& tag, const engine::Tensor& tensor);

  absl::Status SendMessage(int to, std::string message);

  absl::StatusOr<std::string> TakeMessage(int from,
                                          std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(handler_mu_);

  void SetMessageHandler(MessageHandler* handler)
      ABSL_LOCKS_EXCLUDED(handler_mu_);

  absl::StatusOr<engine::Tensor> Recv(const Tag& tag,
                                      std::chrono::milliseconds timeout);

  // Counts a failure this channel observed itself; the connections that
  // close after an abort (its own or a peer's) are consequences, not news.
  void Observe(DataPlaneObserver::Error error) ABSL_LOCKS_EXCLUDED(mu_);

  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t rejected_connections() const;

  absl::Status status() const;

 private:
  // A frame waiting to be written. Shared with the write handler, which
  // keeps the header bytes and the tensor alive until the kernel has them.
  struct OutFrame {
    FrameHeaderBytes header;
    engine::Tensor tensor;  // Tensor frames.
    std::string message;    // Abort and message frames.
    // Message frames: dropped, not an error, once the peer closed its
    // channel (HeaderLink's contract: a peer that stopped its end hears
    // nothing more; two ranks closing together must not fail each other).
    bool droppable = false;
    bool final = false;  // Abort or goodbye: close the link after it.
    std::chrono::steady_clock::time_point queued;  // Tensor frames.
    // Bytes already written (by a direct write the kernel took in part).
    uint64_t offset = 0;

    uint64_t size() const {
      return kFrameHeaderSize +
             (tensor.defined() ? tensor.bytes() : message.size());
    }
    // What is left to write: the header and the payload from `offset` on.
    std::array<asio::const_buffer, 2> Remaining() const {
      const asio::const_buffer payload =
          tensor.defined() ? asio::const_buffer(tensor.raw(), tensor.bytes())
                           : asio::buffer(message);
      if (offset < kFrameHeaderSize) {
        return {asio::buffer(header) + offset, payload};
      }
      return {payload + (offset - kFrameHeaderSize), asio::const_buffer()};
    }
  };

  // The connection this rank opened to send to one peer. I/O thread only.
  struct OutLink {
    OutLink(asio::io_context& io, int rank)
        : socket(io), deadline(io), timer(io), rank(rank) {}
    enum class State { kIdle, kConnecting, kReady, kClosed };
    tcp::socket socket;
    asio::steady_timer deadline;  // Connect deadline.
    asio::steady_timer timer;     // Redial delay, then loss grace.
    const int rank;
    State state = State::kIdle;
    std::vector<tcp::endpoint> endpoints;
    size_t attempts = 0;
    bool timed_out = false;
    std::string last_error = "no attempt";
    HelloBytes hello{};
    HelloAckBytes ack{};
    uint8_t probe = 0;
    std::deque<std::shared_ptr<OutFrame>> queue;
    bool writing = false;       // queue.front() is being written.
    bool final_queued = false;  // Abort or goodbye queued: no more frames.

    // Shared with the threads that Send: the direct-write fast path. A
    // sender writes itself only while `direct` is set and nothing is posted;
    // the I/O thread clears `direct` (holding the lock) before it writes or
    // closes the socket, so the two never write at once.
    absl::Mutex direct_mu;
    // Ready, idle, nothing queued: the I/O thread's verdict (MaybeWrite).
    bool direct ABSL_GUARDED_BY(direct_mu) = false;
    // Frames posted to the I/O thread and not yet queued.
    int posted ABSL_GUARDED_BY(direct_mu) = 0;
    // A frame a direct write left part of: written next, before any other.
    std::shared_ptr<OutFrame> rest ABSL_GUARDED_BY(direct_mu);
  };

  // A connection a peer opened to send to this rank. Shared by its pending
  // handlers, so it can be dropped from in_ while one is outstanding.
  struct InLink {
    InLink(tcp::socket s, asio::io_context& io, uint64_t id)
        : socket(std::move(s)), timer(io), id(id) {}
    tcp::socket socket;
    asio::steady_timer timer;  // Handshake deadline.
    const uint64_t id;
    std::string remote;
    int rank = -1;  // Set once the handshake is accepted.
    bool closed = false;
    bool said_goodbye = false;
    HelloBytes hello{};
    HelloAckBytes ack{};
    FrameHeaderBytes header_bytes{};
    FrameHeader header;
    engine::Tensor tensor;
    std::string message;
  };

  // --- Shared state ---------------------------------------------------------

  void SetAbortStatus(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // I/O thread: hands what is pending to the message handler, if any.
  void FlushMessages() ABSL_LOCKS_EXCLUDED(handler_mu_);

  absl::Status Deliver(const Tag& tag, engine::Tensor tensor, int from)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- I/O thread: names ----------------------------------------------------

  std::string Peer(int rank, absl::string_view fallback_address) const;

  // --- I/O thread: dialing --------------------------------------------------

  void StartConnect(OutLink* l, std::vector<tcp::endpoint> endpoints,
                    Clock::time_point deadline);

  void Dial(OutLink* l);

  void HandshakeFailed(OutLink* l, const asio::error_code& ec);

  void OnHelloAck(OutLink* l, const asio::error_code& ec);

  void ConnectFailed(OutLink* l, const absl::Status& status);

  // The peer never writes on this connection after its HelloAck, so a
  // completed read means it is gone (or broke the protocol).
  void WatchForLoss(OutLink* l);

  // The send side to a peer broke. Unless the peer said goodbye with nothing
  // left to send to it, the job lost a rank; give its own abort frame, if
  // any, a moment to arrive first.
  void OutLinkLost(OutLink* l, const asio::error_code& ec);

  // Reports `reason` (the loss of `l`'s peer) after kPeerLossGrace, unless
  // the peer said goodbye meanwhile. While the peer's connection to this
  // rank is still open its own end decides (its abort frame, queued behind
  // frames it is still sending, or the end of the stream), so the report
  // waits, until `give_up`.
  void ReportLossAfterGrace(OutLink* l, bool undelivered, std::string reason,
                            Clock::time_point give_up);

  // True while a connection from `rank` is open.
  bool InLinkOpenFrom(int rank) const;

  // --- I/O thread: writing --------------------------------------------------

  enum class Direct {
    kBusy,     // Not idle: nothing written; post the frame.
    kWritten,  // The kernel took all of it.
    kPartly,   // The I/O thread writes the rest, before anything else.
  };

  // Caller's thread: writes `frame` now if `l` is idle, without blocking.
  Direct TryDirect(OutLink* l, const std::shared_ptr<OutFrame>& frame);

  // Caller's thread: hands `frame` to the I/O thread, in order with the
  // caller's other frames to `l`.
  void Post(OutLink* l, std::shared_ptr<OutFrame> frame);

  void Enqueue(OutLink* l, std::shared_ptr<OutFrame> frame);

  // Puts a direct write's remainder at the front of the queue: its first
  // bytes are on the wire already.
  void TakeRest(OutLink* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->direct_mu);

  void MaybeWrite(OutLink* l);

  void CloseOutLink(OutLink* l);

  // --- I/O thread: accepting and reading ------------------------------------

  void StartAccept();

  void StartHandshake(const std::shared_ptr<InLink>& link);

  // The secret is checked before anything that would tell a stranger about
  // the job.
  HelloResult Judge(const Hello& hello) const;

  // A connection that failed the handshake: logged and counted, never an
  // abort (strangers must not be able to stop a job).
  void Reject(const std::shared_ptr<InLink>& link, absl::string_view why,
              bool close = true);

  void ReadHeader(const std::shared_ptr<InLink>& link);

  void OnHeader(const std::shared_ptr<InLink>& link);

  void OnTensor(const std::shared_ptr<InLink>& link);

  void BadFrame(const std::shared_ptr<InLink>& link,
                const absl::Status& status);

  void InLinkEnded(const std::shared_ptr<InLink>& link,
                   const asio::error_code& ec);

  void CloseInLink(const std::shared_ptr<InLink>& link);

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

  const TcpChannelConfig config_;
  engine::Backend* const backend_;
  std::atomic<int64_t> rejected_{0};
  uint16_t port_ = 0;

  // Declared before the sockets and timers so it is destroyed after them.
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>>
      work_;

  // I/O thread only (set up before the thread starts).
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  asio::steady_timer linger_timer_;
  std::vector<std::unique_ptr<OutLink>> out_;  // By rank; own entry unused.
  std::map<uint64_t, std::shared_ptr<InLink>> in_;
  uint64_t next_id_ = 0;
  std::vector<bool> said_goodbye_;  // By rank.
  std::vector<bool> in_connected_;  // By rank: accepted a connection from it.
  std::vector<std::string> peer_addresses_;
  bool abort_handled_ = false;
  bool closing_ = false;
  bool finished_ = false;
  bool linger_armed_ = false;

  // Held while a message callback runs, so SetMessageHandler(nullptr)
  // waits for it. Never taken together with mu_.
  absl::Mutex handler_mu_;
  MessageHandler* handler_ ABSL_GUARDED_BY(handler_mu_) = nullptr;
  std::deque<std::pair<int, std::string>> pending_messages_
      ABSL_GUARDED_BY(handler_mu_);
  absl::Status handler_failure_ ABSL_GUARDED_BY(handler_mu_);
  bool failure_delivered_ ABSL_GUARDED_BY(handler_mu_) = false;

  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  Mailbox mailbox_ ABSL_GUARDED_BY(mu_);
  bool connect_called_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  int connects_pending_ ABSL_GUARDED_BY(mu_) = 0;

  // Last member: started last, joined first (in ~Impl).
  std::thread thread_;

 private:
  // Helpers and settings, class members so that every file of the class
  // sees them.

  // Delay between dials while a peer is not listening yet.
  static constexpr std::chrono::milliseconds kRedialDelay{50};

  // When our send-side connection to a peer fails, the peer's abort or goodbye
  // frame may still be on its way over the other connection (the two sockets
  // are read in no particular order). Waiting this long before declaring the
  // peer lost lets the peer's own reason win.
  static constexpr std::chrono::milliseconds kPeerLossGrace{100};

  // Accept errors such as EMFILE are transient; retry after this.
  static constexpr std::chrono::milliseconds kAcceptRetryDelay{100};

  // Rejected connections logged per process: 5 lines per 10 s at most.
  static constexpr int kRejectionLogBurst = 5;
  static constexpr std::chrono::seconds kRejectionLogPeriod{10};

  // asio's transfer_all caps every read and write system call at 64 KiB; this
  // lets one call move as much of a tensor as the socket buffers take, which
  // is what keeps a transfer near raw socket speed.
  struct TransferAllUnbounded {
    size_t operator()(const asio::error_code& ec, size_t /*done*/) const {
      return ec ? 0 : std::numeric_limits<size_t>::max();
    }
  };

  // The kernel zero-fills a fresh receive buffer one page fault at a time as
  // the payload is read into it; for a big tensor that costs about as much as
  // the copy itself (64 MiB: 16k faults). Asking for transparent huge pages
  // cuts that to one fault per 2 MiB, which took 64 MiB transfers from ~45% to
  // ~75% of raw socket speed. Only for buffers large enough that malloc gives
  // them a mapping of their own (glibc: over 32 MiB), so the hint never
  // touches memory shared with other allocations. Best effort: errors (THP
  // disabled, old kernel) are ignored.
  static constexpr uint64_t kHugePageHintBytes = uint64_t{32} << 20;
  static void HintHugePages(void* data, uint64_t bytes);

  // Splits "host:port" or "[v6]:port".
  static absl::Status SplitHostPort(absl::string_view address,
                                    std::string* host, std::string* port);

  static absl::StatusOr<std::vector<tcp::endpoint>> Resolve(
      absl::string_view address, bool passive);

  static std::string EndpointString(const tcp::socket& socket);

  // Whether `backend`'s tensors live in host memory, so the I/O thread may
  // read and write them in place.
  static bool IsHost(engine::Backend* backend);

  static absl::Status HelloRejection(HelloResult result, std::string message);
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_TCP_TCP_CHANNEL_IMPL_H_
