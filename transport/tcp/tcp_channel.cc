#include "transport/tcp/tcp_channel.h"

#include <sys/mman.h>    // madvise
#include <sys/socket.h>  // sendmsg
#include <sys/uio.h>     // iovec
#include <unistd.h>      // sysconf

#include <algorithm>
#include <asio.hpp>  // io_context, ip::tcp, steady_timer, async_read/write
#include <atomic>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <utility>

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

namespace conveyor::transport {
namespace {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// Delay between dials while a peer is not listening yet.
constexpr std::chrono::milliseconds kRedialDelay{50};
// When our send-side connection to a peer fails, the peer's abort or goodbye
// frame may still be on its way over the other connection (the two sockets
// are read in no particular order). Waiting this long before declaring the
// peer lost lets the peer's own reason win.
constexpr std::chrono::milliseconds kPeerLossGrace{100};
// Accept errors such as EMFILE are transient; retry after this.
constexpr std::chrono::milliseconds kAcceptRetryDelay{100};
// Rejected connections logged per process: 5 lines per 10 s at most.
constexpr int kRejectionLogBurst = 5;
constexpr std::chrono::seconds kRejectionLogPeriod{10};

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
constexpr uint64_t kHugePageHintBytes = uint64_t{32} << 20;

void HintHugePages(void* data, uint64_t bytes) {
#ifdef MADV_HUGEPAGE
  if (bytes < kHugePageHintBytes) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin =
      (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end > begin) {
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#else
  (void)data;
  (void)bytes;
#endif
}

// Splits "host:port" or "[v6]:port".
absl::Status SplitHostPort(absl::string_view address, std::string* host,
                           std::string* port) {
  const size_t colon = address.rfind(':');
  uint32_t port_number = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port_number) ||
      port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not host:port"));
  }
  absl::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
  }
  *host = std::string(h);
  *port = std::to_string(port_number);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<tcp::endpoint>> Resolve(absl::string_view address,
                                                   bool passive) {
  std::string host, port;
  if (absl::Status s = SplitHostPort(address, &host, &port); !s.ok()) return s;
  asio::io_context io;
  tcp::resolver resolver(io);
  asio::error_code ec;
  auto flags = tcp::resolver::numeric_service;
  if (passive) flags |= tcp::resolver::passive;
  const auto results = resolver.resolve(host, port, flags, ec);
  if (ec || results.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resolve '", address, "': ", ec ? ec.message() : "no address"));
  }
  std::vector<tcp::endpoint> endpoints;
  for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  return endpoints;
}

std::string EndpointString(const tcp::socket& socket) {
  asio::error_code ec;
  const tcp::endpoint ep = socket.remote_endpoint(ec);
  if (ec) return "unknown address";
  return absl::StrCat(ep.address().to_string(), ":", ep.port());
}

// Whether `backend`'s tensors live in host memory, so the I/O thread may
// read and write them in place.
bool IsHost(engine::Backend* backend) { return backend->host_resident(); }

absl::Status HelloRejection(HelloResult result, std::string message) {
  switch (result) {
    case HelloResult::kBadSecret:
      // With auth tokens the secret is derived from the token
      // (common/auth_token.h: DataPlaneSecret), so a token mismatch between
      // workers ends here: say so, since nothing else will.
      return absl::PermissionDeniedError(absl::StrCat(
          message,
          " (not this job's secret, or the workers were started with "
          "different --auth-token-file tokens)"));
    default:
      return absl::FailedPreconditionError(std::move(message));
  }
}

}  // namespace

class TcpChannel::Impl {
 public:
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

  absl::Status Listen() {
    ASSIGN_OR_RETURN(std::vector<tcp::endpoint> endpoints,
                     Resolve(config_.listen_address, /*passive=*/true));
    asio::error_code ec;
    const tcp::endpoint& ep = endpoints.front();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) port_ = acceptor_.local_endpoint(ec).port();
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("rank ", config_.rank, " cannot listen on ",
                       config_.listen_address, ": ", ec.message()));
    }
    work_.emplace(io_.get_executor());
    StartAccept();
    thread_ = std::thread([this] { io_.run(); });
    return absl::OkStatus();
  }

  uint16_t port() const { return port_; }

  absl::Status Connect(const std::vector<std::string>& peers) {
    {
      absl::MutexLock lock(&mu_);
      if (connect_called_) {
        return absl::FailedPreconditionError("Connect called twice");
      }
      connect_called_ = true;
      if (!status_.ok()) return status_;
    }
    if (static_cast<int>(peers.size()) != config_.world_size) {
      const absl::Status s = absl::InvalidArgumentError(
          absl::StrCat("rank ", config_.rank, ": ", peers.size(),
                       " peer addresses for ", config_.world_size, " ranks"));
      Fail(s);
      return s;
    }
    std::vector<std::vector<tcp::endpoint>> endpoints(config_.world_size);
    for (int r = 0; r < config_.world_size; ++r) {
      if (r == config_.rank) continue;
      absl::StatusOr<std::vector<tcp::endpoint>> ep =
          Resolve(peers[r], /*passive=*/false);
      if (!ep.ok()) {
        const absl::Status s =
            WithContext(ep.status(),
                        absl::StrCat("rank ", config_.rank, ", peer rank ", r));
        Fail(s);
        return s;
      }
      endpoints[r] = *std::move(ep);
    }
    {
      absl::MutexLock lock(&mu_);
      connects_pending_ = config_.world_size - 1;
    }
    const Clock::time_point deadline = Clock::now() + config_.connect_timeout;
    asio::post(io_, [this, peers, endpoints, deadline] {
      peer_addresses_ = peers;
      for (int r = 0; r < config_.world_size; ++r) {
        if (r != config_.rank) {
          StartConnect(out_[r].get(), endpoints[r], deadline);
        }
      }
    });
    // Every dial ends by its deadline timer at the latest, so this wait is
    // bounded without a timeout of its own.
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return connects_pending_ == 0 || !status_.ok();
    };
    mu_.Await(absl::Condition(&done));
    if (!status_.ok()) return status_;
    connected_ = true;
    return absl::OkStatus();
  }

  absl::Status Send(int to, const Tag& tag, const engine::Tensor& tensor) {
    {
      absl::MutexLock lock(&mu_);
      if (!status_.ok()) return status_;
      if (!connected_ && to != config_.rank) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", config_.rank, " sends before Connect succeeded"));
      }
    }
    if (to < 0 || to >= config_.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", config_.rank, " sends to unknown rank ", to));
    }
    if (tag.job != config_.job) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", config_.rank, " sends the ", ToString(tag),
                       " in job ", config_.job));
    }
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", config_.rank, " sends an undefined ", ToString(tag)));
    }
    if (tensor.bytes() > config_.max_frame_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", ToString(tag), " has ", tensor.bytes(),
          " bytes, more than max_frame_bytes ", config_.max_frame_bytes));
    }
    absl::StatusOr<FrameHeader> header = TensorFrameHeader(tag, tensor);
    if (!header.ok()) return header.status();

    // The I/O thread may read only host memory, and only the caller's thread
    // may drive the tensor's backend: stage device tensors here, in the
    // backend's staging memory (page-locked on CUDA, so the copy runs at
    // DMA speed).
    engine::Tensor payload = tensor;
    if (!IsHost(tensor.backend())) {
      absl::StatusOr<engine::Tensor> host =
          tensor.backend()->EmptyHostStaging(tensor.shape(), tensor.dtype());
      if (!host.ok()) return host.status();
      absl::Status s =
          tensor.backend()->CopyToHost(tensor, host->raw(), tensor.bytes());
      if (!s.ok()) return s;
      payload = *std::move(host);
    }
    if (to == config_.rank) {
      return Deliver(tag, std::move(payload), config_.rank);
    }

    auto frame = std::make_shared<OutFrame>();
    EncodeFrameHeader(*header, &frame->header);
    frame->tensor = std::move(payload);
    if (config_.observer != nullptr) {
      frame->queued = std::chrono::steady_clock::now();
    }
    OutLink* l = out_[to].get();
    const Direct direct = frame->size() <= config_.direct_write_max_bytes
                              ? TryDirect(l, frame)
                              : Direct::kBusy;
    if (direct == Direct::kWritten && config_.observer != nullptr) {
      config_.observer->OnSent(
          to, frame->tensor.bytes(),
          std::chrono::steady_clock::now() - frame->queued);
    }
    if (direct == Direct::kBusy) Post(l, std::move(frame));
    return absl::OkStatus();
  }

  absl::Status SendMessage(int to, std::string message) {
    {
      absl::MutexLock lock(&mu_);
      if (!status_.ok()) return status_;
      if (!connected_) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", config_.rank,
                         " sends a message before Connect succeeded"));
      }
    }
    if (to < 0 || to >= config_.world_size || to == config_.rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", config_.rank, " sends a message to rank ", to,
                       ", which is not a peer"));
    }
    if (message.size() > kMaxMessageBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", config_.rank, " sends a message of ",
                       message.size(), " bytes; at most ", kMaxMessageBytes));
    }
    auto frame = std::make_shared<OutFrame>();
    EncodeFrameHeader(MessageFrameHeader(config_.job, message.size()),
                      &frame->header);
    frame->message = std::move(message);
    frame->droppable = true;
    Post(out_[to].get(), std::move(frame));
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> TakeMessage(int from,
                                          std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(handler_mu_) {
    absl::MutexLock lock(&handler_mu_);
    if (handler_ != nullptr) {
      return absl::FailedPreconditionError(
          "TakeMessage while a message handler is set");
    }
    auto find = [&] {
      return std::find_if(pending_messages_.begin(), pending_messages_.end(),
                          [&](const std::pair<int, std::string>& m) {
                            return m.first == from;
                          });
    };
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(handler_mu_) {
      return !handler_failure_.ok() || find() != pending_messages_.end();
    };
    handler_mu_.AwaitWithTimeout(absl::Condition(&ready),
                                 absl::FromChrono(timeout));
    if (auto it = find(); it != pending_messages_.end()) {
      std::string message = std::move(it->second);
      pending_messages_.erase(it);
      return message;
    }
    if (!handler_failure_.ok()) return handler_failure_;
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", config_.rank, " waited ", timeout.count(),
                     " ms for a message from rank ", from));
  }

  void SetMessageHandler(MessageHandler* handler)
      ABSL_LOCKS_EXCLUDED(handler_mu_) {
    absl::MutexLock lock(&handler_mu_);
    handler_ = handler;
    if (handler == nullptr) return;
    // Deliver on the I/O thread, like everything after, so callbacks never
    // run concurrently.
    asio::post(io_, [this] { FlushMessages(); });
  }

  absl::StatusOr<engine::Tensor> Recv(const Tag& tag,
                                      std::chrono::milliseconds timeout) {
    engine::Tensor tensor;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<std::optional<engine::Tensor>> arrived =
          mailbox_.Await(mu_, status_, tag, timeout);
      if (!arrived.ok()) return arrived.status();
      if (!arrived->has_value()) {
        const absl::Status timed_out = mailbox_.TimeoutError(tag, timeout);
        if (config_.abort_on_recv_timeout) {
          SetAbortStatus(timed_out);
        }
        Observe(DataPlaneObserver::Error::kTimeout);
        return timed_out;
      }
      tensor = **std::move(arrived);
    }
    // Host memory serves every CPU backend (fp32 or bf16 GEMMs alike).
    if (IsHost(backend_)) return tensor;
    // Received into host memory by the I/O thread; moved to the caller's
    // backend here, on the thread that drives it.
    absl::StatusOr<engine::Tensor> device =
        backend_->Empty(tensor.shape(), tensor.dtype());
    if (!device.ok()) return device.status();
    absl::Status s =
        backend_->CopyFromHost(tensor.raw(), tensor.bytes(), *device);
    if (!s.ok()) return s;
    return device;
  }

  // Counts a failure this channel observed itself; the connections that
  // close after an abort (its own or a peer's) are consequences, not news.
  void Observe(DataPlaneObserver::Error error) ABSL_LOCKS_EXCLUDED(mu_) {
    if (config_.observer == nullptr) return;
    if (error == DataPlaneObserver::Error::kPeerLost) {
      absl::MutexLock lock(&mu_);
      if (!status_.ok()) return;
    }
    config_.observer->OnError(error);
  }

  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    SetAbortStatus(status);
  }

  int64_t rejected_connections() const { return rejected_.load(); }

  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

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
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!status_.ok()) return;
    status_ =
        status.ok() ? absl::AbortedError("aborted with an OK status") : status;
    // Tensors that arrived are of no use to an aborted job; free them now.
    mailbox_.Clear();
    SPDLOG_WARN("transport: rank {} aborts: {}", config_.rank,
                std::string(status_.message()));
    asio::post(io_, [this, s = status_] {
      {
        absl::MutexLock lock(&handler_mu_);
        handler_failure_ = s;
      }
      FlushMessages();
      OnAbort(s);
    });
  }

  // I/O thread: hands what is pending to the message handler, if any.
  void FlushMessages() ABSL_LOCKS_EXCLUDED(handler_mu_) {
    absl::MutexLock lock(&handler_mu_);
    if (handler_ == nullptr) return;
    while (!pending_messages_.empty()) {
      auto [from, message] = std::move(pending_messages_.front());
      pending_messages_.pop_front();
      handler_->OnMessage(from, std::move(message));
    }
    if (!handler_failure_.ok() && !failure_delivered_) {
      failure_delivered_ = true;
      handler_->OnChannelFailed(handler_failure_);
    }
  }

  absl::Status Deliver(const Tag& tag, engine::Tensor tensor, int from)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    return mailbox_.File(tag, std::move(tensor), from);
  }

  // --- I/O thread: names ----------------------------------------------------

  std::string Peer(int rank, absl::string_view fallback_address) const {
    const std::string& address = peer_addresses_[rank].empty()
                                     ? std::string(fallback_address)
                                     : peer_addresses_[rank];
    return absl::StrCat("rank ", rank, " (", address, ")");
  }

  // --- I/O thread: dialing --------------------------------------------------

  void StartConnect(OutLink* l, std::vector<tcp::endpoint> endpoints,
                    Clock::time_point deadline) {
    if (l->state != OutLink::State::kIdle) return;  // Aborted meanwhile.
    l->state = OutLink::State::kConnecting;
    l->endpoints = std::move(endpoints);
    l->deadline.expires_at(deadline);
    l->deadline.async_wait([this, l](const asio::error_code& ec) {
      if (ec || l->state != OutLink::State::kConnecting) return;
      // Whatever is pending (dial, redial delay, handshake) fails now.
      l->timed_out = true;
      asio::error_code ignored;
      l->socket.close(ignored);
      l->timer.cancel();
    });
    Dial(l);
  }

  void Dial(OutLink* l) {
    if (l->state != OutLink::State::kConnecting) return;
    if (l->timed_out) {
      ConnectFailed(
          l, absl::DeadlineExceededError(absl::StrCat(
                 "rank ", config_.rank, " could not connect to ",
                 Peer(l->rank, ""), " within ", config_.connect_timeout.count(),
                 " ms; last error: ", l->last_error)));
      return;
    }
    asio::error_code ignored;
    l->socket.close(ignored);
    const tcp::endpoint ep = l->endpoints[l->attempts++ % l->endpoints.size()];
    l->socket.async_connect(ep, [this, l](const asio::error_code& ec) {
      if (l->state != OutLink::State::kConnecting) return;
      if (ec) {
        // Usually "connection refused": the peer is not listening yet.
        if (!l->timed_out) l->last_error = ec.message();
        l->timer.expires_after(kRedialDelay);
        l->timer.async_wait([this, l](const asio::error_code&) { Dial(l); });
        return;
      }
      asio::error_code ignored;
      l->socket.set_option(tcp::no_delay(true), ignored);
      EncodeHello({.version = kWireVersion,
                   .from_rank = config_.rank,
                   .to_rank = l->rank,
                   .job = config_.job,
                   .secret = config_.secret},
                  &l->hello);
      asio::async_write(l->socket, asio::buffer(l->hello),
                        [this, l](const asio::error_code& ec, size_t) {
                          if (l->state != OutLink::State::kConnecting) return;
                          if (ec) return HandshakeFailed(l, ec);
                          asio::async_read(
                              l->socket, asio::buffer(l->ack),
                              [this, l](const asio::error_code& ec, size_t) {
                                OnHelloAck(l, ec);
                              });
                        });
    });
  }

  void HandshakeFailed(OutLink* l, const asio::error_code& ec) {
    if (l->timed_out) {
      l->last_error = "handshake not answered";
      Dial(l);  // Reports the deadline.
      return;
    }
    ConnectFailed(l, absl::UnavailableError(absl::StrCat(
                         "rank ", config_.rank, ": handshake with ",
                         Peer(l->rank, ""), " failed: ", ec.message())));
  }

  void OnHelloAck(OutLink* l, const asio::error_code& ec) {
    if (l->state != OutLink::State::kConnecting) return;
    if (ec) return HandshakeFailed(l, ec);
    absl::StatusOr<HelloResult> result = DecodeHelloAck(l->ack);
    if (!result.ok()) {
      return ConnectFailed(
          l, WithContext(result.status(),
                         absl::StrCat("rank ", config_.rank, ": ",
                                      Peer(l->rank, ""), " answered")));
    }
    if (*result != HelloResult::kOk) {
      return ConnectFailed(
          l, HelloRejection(
                 *result,
                 absl::StrCat(Peer(l->rank, ""),
                              " refused the connection from rank ",
                              config_.rank, ": ", HelloResultName(*result))));
    }
    l->state = OutLink::State::kReady;
    l->deadline.cancel();
    WatchForLoss(l);
    {
      absl::MutexLock lock(&mu_);
      --connects_pending_;
    }
    MaybeWrite(l);
  }

  void ConnectFailed(OutLink* l, const absl::Status& status) {
    CloseOutLink(l);
    Fail(status);
  }

  // The peer never writes on this connection after its HelloAck, so a
  // completed read means it is gone (or broke the protocol).
  void WatchForLoss(OutLink* l) {
    l->socket.async_read_some(
        asio::buffer(&l->probe, 1),
        [this, l](const asio::error_code& ec, size_t) {
          if (l->state == OutLink::State::kClosed) return;
          if (!ec) {
            CloseOutLink(l);
            Fail(absl::InvalidArgumentError(
                absl::StrCat("rank ", config_.rank, ": ", Peer(l->rank, ""),
                             " wrote on a send-only connection")));
            return;
          }
          OutLinkLost(l, ec);
        });
  }

  // The send side to a peer broke. Unless the peer said goodbye with nothing
  // left to send to it, the job lost a rank; give its own abort frame, if
  // any, a moment to arrive first.
  void OutLinkLost(OutLink* l, const asio::error_code& ec) {
    {
      absl::MutexLock lock(&l->direct_mu);
      TakeRest(l);
    }
    // Message frames to a peer that closed may go unread (see OutFrame).
    const bool undelivered = std::any_of(
        l->queue.begin(), l->queue.end(),
        [](const std::shared_ptr<OutFrame>& f) { return !f->droppable; });
    CloseOutLink(l);
    if (closing_) return;
    std::string reason =
        absl::StrCat("rank ", config_.rank, " lost the connection to ",
                     Peer(l->rank, ""), ": ", ec.message());
    l->timer.expires_after(kPeerLossGrace);
    l->timer.async_wait(
        [this, l, undelivered, reason](const asio::error_code& timer_ec) {
          if (timer_ec) return;  // Closing: nothing to report.
          if (said_goodbye_[l->rank] && !undelivered) return;
          Observe(DataPlaneObserver::Error::kPeerLost);
          Fail(absl::UnavailableError(reason));
        });
  }

  // --- I/O thread: writing --------------------------------------------------

  enum class Direct {
    kBusy,     // Not idle: nothing written; post the frame.
    kWritten,  // The kernel took all of it.
    kPartly,   // The I/O thread writes the rest, before anything else.
  };

  // Caller's thread: writes `frame` now if `l` is idle, without blocking.
  Direct TryDirect(OutLink* l, const std::shared_ptr<OutFrame>& frame) {
    {
      absl::MutexLock lock(&l->direct_mu);
      if (!l->direct || l->posted > 0) return Direct::kBusy;
      const std::array<asio::const_buffer, 2> buffers = frame->Remaining();
      iovec iov[2];
      for (int i = 0; i < 2; ++i) {
        iov[i].iov_base = const_cast<void*>(buffers[i].data());
        iov[i].iov_len = buffers[i].size();
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      const ssize_t n = ::sendmsg(l->socket.native_handle(), &msg,
                                  MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n >= 0 && static_cast<uint64_t>(n) == frame->size()) {
        return Direct::kWritten;
      }
      // Full socket buffer or an error: the I/O thread writes the rest, and
      // meets the error (if any) on its own write.
      frame->offset = n > 0 ? static_cast<uint64_t>(n) : 0;
      l->rest = frame;
      l->direct = false;
    }
    asio::post(io_, [this, l] { MaybeWrite(l); });
    return Direct::kPartly;
  }

  // Caller's thread: hands `frame` to the I/O thread, in order with the
  // caller's other frames to `l`.
  void Post(OutLink* l, std::shared_ptr<OutFrame> frame) {
    {
      absl::MutexLock lock(&l->direct_mu);
      ++l->posted;
    }
    asio::post(io_, [this, l, frame = std::move(frame)]() mutable {
      {
        absl::MutexLock lock(&l->direct_mu);
        --l->posted;
      }
      Enqueue(l, std::move(frame));
    });
  }

  void Enqueue(OutLink* l, std::shared_ptr<OutFrame> frame) {
    if (said_goodbye_[l->rank] && frame->droppable) return;
    if (said_goodbye_[l->rank] && !abort_handled_ && !closing_) {
      // The peer closed its channel: nobody would read this tensor.
      Fail(absl::FailedPreconditionError(
          absl::StrCat("rank ", config_.rank, " sends to ", Peer(l->rank, ""),
                       ", which has closed its channel")));
      return;
    }
    if (l->state == OutLink::State::kClosed || l->final_queued) return;
    l->final_queued = frame->final;
    l->queue.push_back(std::move(frame));
    MaybeWrite(l);
  }

  // Puts a direct write's remainder at the front of the queue: its first
  // bytes are on the wire already.
  void TakeRest(OutLink* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->direct_mu) {
    if (l->rest == nullptr) return;
    l->queue.push_front(std::move(l->rest));
    l->rest = nullptr;
  }

  void MaybeWrite(OutLink* l) {
    absl::MutexLock lock(&l->direct_mu);
    TakeRest(l);
    const bool idle = l->state == OutLink::State::kReady && !l->writing;
    if (!idle || l->queue.empty()) {
      l->direct = idle && l->queue.empty() && !l->final_queued &&
                  !said_goodbye_[l->rank] && !abort_handled_ && !closing_;
      return;
    }
    l->direct = false;
    l->writing = true;
    // Header and payload in one gather write: no staging copy of the tensor.
    asio::async_write(
        l->socket, l->queue.front()->Remaining(), TransferAllUnbounded(),
        [this, l](const asio::error_code& ec, size_t) {
          l->writing = false;
          if (l->state == OutLink::State::kClosed) {
            l->queue.clear();
            return;
          }
          if (ec) return OutLinkLost(l, ec);
          const OutFrame& sent = *l->queue.front();
          if (config_.observer != nullptr && sent.tensor.defined()) {
            config_.observer->OnSent(
                l->rank, sent.tensor.bytes(),
                std::chrono::steady_clock::now() - sent.queued);
          }
          const bool final = sent.final;
          l->queue.pop_front();
          if (final) {
            // FIN after the last frame, so the peer reads it
            // before EOF.
            asio::error_code ignored;
            l->socket.shutdown(tcp::socket::shutdown_send, ignored);
            CloseOutLink(l);
            return;
          }
          MaybeWrite(l);
        });
  }

  void CloseOutLink(OutLink* l) {
    {
      // No direct write may be using the socket as it closes.
      absl::MutexLock lock(&l->direct_mu);
      l->direct = false;
      l->rest = nullptr;
    }
    l->state = OutLink::State::kClosed;
    asio::error_code ignored;
    l->socket.close(ignored);
    l->deadline.cancel();
    // Frames being written stay until their handler runs.
    if (!l->writing) l->queue.clear();
    MaybeFinishClose();
  }

  // --- I/O thread: accepting and reading ------------------------------------

  void StartAccept() {
    acceptor_.async_accept([this](const asio::error_code& ec,
                                  tcp::socket socket) {
      if (!acceptor_.is_open() || ec == asio::error::operation_aborted) return;
      if (ec) {
        SPDLOG_WARN("transport: rank {} accept failed: {}", config_.rank,
                    ec.message());
        accept_retry_.expires_after(kAcceptRetryDelay);
        accept_retry_.async_wait([this](const asio::error_code& ec) {
          if (!ec) StartAccept();
        });
        return;
      }
      auto link = std::make_shared<InLink>(std::move(socket), io_, next_id_++);
      link->remote = EndpointString(link->socket);
      in_[link->id] = link;
      StartHandshake(link);
      StartAccept();
    });
  }

  void StartHandshake(const std::shared_ptr<InLink>& link) {
    link->timer.expires_after(config_.connect_timeout);
    link->timer.async_wait(
        [this, weak = std::weak_ptr<InLink>(link)](const asio::error_code& ec) {
          auto l = weak.lock();
          if (ec || !l || l->closed || l->rank >= 0) return;
          Reject(l, "handshake timed out");
        });
    asio::async_read(
        link->socket, asio::buffer(link->hello),
        [this, link](const asio::error_code& ec, size_t) {
          if (link->closed) return;
          if (ec) {
            return Reject(link, absl::StrCat("closed during the handshake: ",
                                             ec.message()));
          }
          absl::StatusOr<Hello> hello = DecodeHello(link->hello);
          // Not our protocol: no answer, just close.
          if (!hello.ok()) return Reject(link, hello.status().message());
          const HelloResult result = Judge(*hello);
          if (result != HelloResult::kOk) {
            Reject(link, HelloResultName(result), /*close=*/false);
          } else {
            link->rank = hello->from_rank;
            in_connected_[link->rank] = true;
          }
          EncodeHelloAck(result, &link->ack);
          asio::async_write(
              link->socket, asio::buffer(link->ack),
              [this, link, result](const asio::error_code& ec, size_t) {
                if (link->closed) return;
                if (result != HelloResult::kOk) return CloseInLink(link);
                link->timer.cancel();
                if (ec) return InLinkEnded(link, ec);
                ReadHeader(link);
              });
        });
  }

  // The secret is checked before anything that would tell a stranger about
  // the job.
  HelloResult Judge(const Hello& hello) const {
    if (hello.version != kWireVersion) return HelloResult::kBadVersion;
    if (!ConstantTimeEquals(hello.secret, config_.secret)) {
      return HelloResult::kBadSecret;
    }
    if (hello.job != config_.job) return HelloResult::kWrongJob;
    if (hello.to_rank != config_.rank || hello.from_rank < 0 ||
        hello.from_rank >= config_.world_size ||
        hello.from_rank == config_.rank) {
      return HelloResult::kWrongRank;
    }
    if (in_connected_[hello.from_rank]) return HelloResult::kDuplicate;
    return HelloResult::kOk;
  }

  // A connection that failed the handshake: logged and counted, never an
  // abort (strangers must not be able to stop a job).
  void Reject(const std::shared_ptr<InLink>& link, absl::string_view why,
              bool close = true) {
    rejected_.fetch_add(1);
    Observe(DataPlaneObserver::Error::kRejected);
    // Strangers choose how often this happens; the counter and the metric
    // see every one, the log a few per period.
    static LogRateLimiter log_limiter(kRejectionLogBurst, kRejectionLogPeriod);
    uint64_t suppressed = 0;
    if (log_limiter.Allow(&suppressed)) {
      SPDLOG_WARN(
          "transport: rank {} rejected a connection from {}: {}{}",
          config_.rank, link->remote, std::string(why),
          suppressed == 0
              ? ""
              : absl::StrCat(" (", suppressed,
                             " more rejections in this process not logged)"));
    }
    if (close) CloseInLink(link);
  }

  void ReadHeader(const std::shared_ptr<InLink>& link) {
    asio::async_read(link->socket, asio::buffer(link->header_bytes),
                     [this, link](const asio::error_code& ec, size_t) {
                       if (link->closed) return;
                       if (ec) return InLinkEnded(link, ec);
                       absl::StatusOr<FrameHeader> header =
                           DecodeFrameHeader(link->header_bytes, config_.job,
                                             config_.max_frame_bytes);
                       if (!header.ok()) return BadFrame(link, header.status());
                       link->header = *std::move(header);
                       OnHeader(link);
                     });
  }

  void OnHeader(const std::shared_ptr<InLink>& link) {
    const FrameHeader& h = link->header;
    switch (h.kind) {
      case FrameKind::kActivation:
      case FrameKind::kGradient:
      case FrameKind::kPartialSum: {
        // The header is validated: this allocates exactly the announced
        // (and bounded) size, and the payload lands in it directly.
        // Into the receiving backend's staging memory: page-locked for a
        // GPU, which Recv then copies it to at DMA speed.
        absl::StatusOr<engine::Tensor> tensor =
            backend_->EmptyHostStaging(h.shape, h.dtype);
        if (!tensor.ok()) return BadFrame(link, tensor.status());
        link->tensor = *std::move(tensor);
        if (IsHost(backend_))
          HintHugePages(link->tensor.raw(), h.payload_bytes);
        if (h.payload_bytes == 0) return OnTensor(link);
        asio::async_read(
            link->socket,
            asio::mutable_buffer(link->tensor.raw(), h.payload_bytes),
            TransferAllUnbounded(),
            [this, link](const asio::error_code& ec, size_t) {
              if (link->closed) return;
              if (ec) return InLinkEnded(link, ec);
              OnTensor(link);
            });
        return;
      }
      case FrameKind::kAbort:
        link->message.resize(h.payload_bytes);
        asio::async_read(
            link->socket, asio::buffer(link->message),
            [this, link](const asio::error_code& ec, size_t) {
              if (link->closed) return;
              if (ec) return InLinkEnded(link, ec);
              CloseInLink(link);
              Fail(absl::Status(
                  static_cast<absl::StatusCode>(link->header.status_code),
                  absl::StrCat(Peer(link->rank, link->remote),
                               " aborted the job: ", link->message)));
            });
        return;
      case FrameKind::kMessage:
        link->message.resize(h.payload_bytes);
        asio::async_read(link->socket, asio::buffer(link->message),
                         [this, link](const asio::error_code& ec, size_t) {
                           if (link->closed) return;
                           if (ec) return InLinkEnded(link, ec);
                           {
                             absl::MutexLock lock(&handler_mu_);
                             if (handler_failure_.ok()) {
                               pending_messages_.emplace_back(
                                   link->rank, std::move(link->message));
                             }
                           }
                           link->message.clear();
                           FlushMessages();
                           ReadHeader(link);
                         });
        return;
      case FrameKind::kGoodbye:
        link->said_goodbye = true;
        said_goodbye_[link->rank] = true;
        MaybeWrite(out_[link->rank].get());  // No more direct writes to it.
        ReadHeader(link);                    // Expecting end of file.
        return;
    }
  }

  void OnTensor(const std::shared_ptr<InLink>& link) {
    const Tag tag = TagOf(link->header);
    if (config_.observer != nullptr) {
      config_.observer->OnReceived(link->rank, link->tensor.bytes());
    }
    absl::Status s = Deliver(tag, std::move(link->tensor), link->rank);
    link->tensor = engine::Tensor();
    if (!s.ok()) {
      if (s.code() == absl::StatusCode::kInternal) {
        BadFrame(link, s);  // A duplicate tag: the peer is broken.
      } else {
        CloseInLink(link);  // Aborted meanwhile; nothing to add.
      }
      return;
    }
    ReadHeader(link);
  }

  void BadFrame(const std::shared_ptr<InLink>& link,
                const absl::Status& status) {
    CloseInLink(link);
    Observe(DataPlaneObserver::Error::kBadFrame);
    Fail(
        WithContext(status, absl::StrCat("rank ", config_.rank, ": frame from ",
                                         Peer(link->rank, link->remote))));
  }

  void InLinkEnded(const std::shared_ptr<InLink>& link,
                   const asio::error_code& ec) {
    CloseInLink(link);
    if (ec == asio::error::operation_aborted || closing_) return;
    if (link->said_goodbye && ec == asio::error::eof) return;
    Observe(DataPlaneObserver::Error::kPeerLost);
    Fail(absl::UnavailableError(
        absl::StrCat("rank ", config_.rank, " lost the connection from ",
                     Peer(link->rank, link->remote), ": ", ec.message())));
  }

  void CloseInLink(const std::shared_ptr<InLink>& link) {
    link->closed = true;
    asio::error_code ignored;
    link->socket.close(ignored);
    link->timer.cancel();
    in_.erase(link->id);
  }

  // --- I/O thread: abort and close ------------------------------------------

  // Tells every connected peer why, then closes. A frame being written is
  // finished first (the stream would be garbage otherwise); queued ones are
  // dropped.
  void OnAbort(const absl::Status& status) {
    if (abort_handled_) return;
    abort_handled_ = true;
    ArmLinger();
    for (auto& l : out_) {
      if (l->state != OutLink::State::kReady) {
        CloseOutLink(l.get());
        continue;
      }
      if (l->final_queued) continue;  // Closing already says goodbye.
      {
        absl::MutexLock lock(&l->direct_mu);
        TakeRest(l.get());
        l->direct = false;
      }
      // A frame partly on the wire is finished; the rest are dropped.
      const bool keep_front =
          l->writing || (!l->queue.empty() && l->queue.front()->offset > 0);
      l->queue.erase(keep_front ? l->queue.begin() + 1 : l->queue.begin(),
                     l->queue.end());
      auto frame = std::make_shared<OutFrame>();
      EncodeFrameHeader(AbortFrameHeader(config_.job, status), &frame->header);
      frame->message = AbortPayload(status);
      frame->final = true;
      Enqueue(l.get(), std::move(frame));
    }
    CloseInbound();
    MaybeFinishClose();
  }

  // Destructor: flush what was sent, then a goodbye on each connection.
  void BeginClose() {
    closing_ = true;
    ArmLinger();
    for (auto& l : out_) {
      if (l->state == OutLink::State::kReady) {
        if (l->final_queued) continue;
        auto frame = std::make_shared<OutFrame>();
        EncodeFrameHeader(GoodbyeFrameHeader(config_.job), &frame->header);
        frame->final = true;
        Enqueue(l.get(), std::move(frame));
      } else {
        CloseOutLink(l.get());
      }
    }
    MaybeFinishClose();
  }

  void ArmLinger() {
    if (linger_armed_) return;
    linger_armed_ = true;
    linger_timer_.expires_after(config_.linger);
    linger_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec) return;
      for (auto& l : out_) CloseOutLink(l.get());
      MaybeFinishClose();
    });
  }

  void CloseInbound() {
    asio::error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
    auto links = std::move(in_);
    in_.clear();
    for (auto& [id, link] : links) CloseInLink(link);
  }

  // Once every send-side connection is closed, closes the rest and lets the
  // I/O thread's run() return.
  void MaybeFinishClose() {
    if (!closing_ || finished_) return;
    for (auto& l : out_) {
      if (l->state != OutLink::State::kClosed) return;
    }
    finished_ = true;
    CloseInbound();
    linger_timer_.cancel();
    for (auto& l : out_) l->timer.cancel();
    work_.reset();
  }

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
};

absl::StatusOr<std::unique_ptr<TcpChannel>> TcpChannel::Create(
    const TcpChannelConfig& config, engine::Backend* backend) {
  if (config.world_size < 1 || config.rank < 0 ||
      config.rank >= config.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", config.rank, " outside a job of ",
                     config.world_size, " ranks"));
  }
  if (config.secret.empty() || config.secret.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job secret must have 1 to ", kMaxSecretBytes,
                     " bytes, not ", config.secret.size()));
  }
  if (backend == nullptr) {
    return absl::InvalidArgumentError("TcpChannel needs a backend");
  }
  auto impl = std::make_unique<Impl>(config, backend);
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<TcpChannel>(new TcpChannel(std::move(impl)));
}

TcpChannel::TcpChannel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpChannel::~TcpChannel() = default;

uint16_t TcpChannel::port() const { return impl_->port(); }

absl::Status TcpChannel::Connect(const std::vector<std::string>& peers) {
  return impl_->Connect(peers);
}

absl::Status TcpChannel::Send(int to, const Tag& tag,
                              const engine::Tensor& tensor) {
  return impl_->Send(to, tag, tensor);
}

absl::StatusOr<engine::Tensor> TcpChannel::Recv(
    const Tag& tag, std::chrono::milliseconds timeout) {
  return impl_->Recv(tag, timeout);
}

void TcpChannel::Abort(const absl::Status& status) { impl_->Fail(status); }

absl::Status TcpChannel::SendMessage(int to, std::string message) {
  return impl_->SendMessage(to, std::move(message));
}

absl::StatusOr<std::string> TcpChannel::TakeMessage(
    int from, std::chrono::milliseconds timeout) {
  return impl_->TakeMessage(from, timeout);
}

void TcpChannel::SetMessageHandler(MessageHandler* handler) {
  impl_->SetMessageHandler(handler);
}

int64_t TcpChannel::rejected_connections() const {
  return impl_->rejected_connections();
}

absl::Status TcpChannel::status() const { return impl_->status(); }

}  // namespace conveyor::transport
