#include "transport/tcp/internal/reader.h"

#include <sys/mman.h>  // madvise
#include <unistd.h>    // sysconf

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_rate_limiter.h"
#include "spdlog/spdlog.h"
#include "transport/mailbox.h"  // WithContext
#include "transport/tcp/internal/net.h"

namespace conveyor::transport::tcp_internal {

using tcp = asio::ip::tcp;

Reader::Reader(asio::io_context& io, const TcpChannelConfig& config,
               engine::Backend* backend, Owner* owner)
    : io_(io),
      config_(config),
      backend_(backend),
      owner_(owner),
      acceptor_(io),
      accept_retry_(io),
      in_connected_(config.world_size, false) {}

void Reader::HintHugePages(void* data, uint64_t bytes) {
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

asio::error_code Reader::Listen(const tcp::endpoint& ep, uint16_t* port) {
  asio::error_code ec;
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) *port = acceptor_.local_endpoint(ec).port();
  return ec;
}

void Reader::StartAccept() {
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

bool Reader::OpenFrom(int rank) const {
  return std::any_of(in_.begin(), in_.end(), [rank](const auto& entry) {
    return entry.second->rank == rank && !entry.second->closed;
  });
}

void Reader::CloseAll() {
  asio::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  auto links = std::move(in_);
  in_.clear();
  for (auto& [id, link] : links) CloseInLink(link);
}

void Reader::StartHandshake(const std::shared_ptr<InLink>& link) {
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

HelloResult Reader::Judge(const Hello& hello) const {
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

void Reader::Reject(const std::shared_ptr<InLink>& link, absl::string_view why,
                    bool close /*= true*/) {
  rejected_.fetch_add(1);
  owner_->Observe(DataPlaneObserver::Error::kRejected);
  // Strangers choose how often this happens; the counter and the metric
  // see every one, the log a few per period.
  static LogRateLimiter log_limiter(kRejectionLogBurst, kRejectionLogPeriod);
  uint64_t suppressed = 0;
  if (log_limiter.Allow(&suppressed)) {
    SPDLOG_WARN(
        "transport: rank {} rejected a connection from {}: {}{}", config_.rank,
        link->remote, std::string(why),
        suppressed == 0
            ? ""
            : absl::StrCat(" (", suppressed,
                           " more rejections in this process not logged)"));
  }
  if (close) CloseInLink(link);
}

void Reader::ReadHeader(const std::shared_ptr<InLink>& link) {
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

void Reader::OnHeader(const std::shared_ptr<InLink>& link) {
  const FrameHeader& h = link->header;
  switch (h.kind) {
    case FrameKind::kActivation:
    case FrameKind::kGradient:
    case FrameKind::kPartialSum:
    case FrameKind::kEvalActivation: {
      // The header is validated: this allocates exactly the announced
      // (and bounded) size, and the payload lands in it directly.
      // Into the receiving backend's staging memory: page-locked for a
      // GPU, which Recv then copies it to at DMA speed.
      absl::StatusOr<engine::Tensor> tensor =
          backend_->EmptyHostStaging(h.shape, h.dtype);
      if (!tensor.ok()) return BadFrame(link, tensor.status());
      link->tensor = *std::move(tensor);
      if (backend_->host_resident()) {
        HintHugePages(link->tensor.raw(), h.payload_bytes);
      }
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
            owner_->Fail(absl::Status(
                static_cast<absl::StatusCode>(link->header.status_code),
                absl::StrCat(owner_->Peer(link->rank, link->remote),
                             " aborted the job: ", link->message)));
          });
      return;
    case FrameKind::kMessage:
      link->message.resize(h.payload_bytes);
      asio::async_read(link->socket, asio::buffer(link->message),
                       [this, link](const asio::error_code& ec, size_t) {
                         if (link->closed) return;
                         if (ec) return InLinkEnded(link, ec);
                         owner_->OnMessage(link->rank,
                                           std::move(link->message));
                         link->message.clear();
                         ReadHeader(link);
                       });
      return;
    case FrameKind::kGoodbye:
      link->said_goodbye = true;
      owner_->OnGoodbye(link->rank);  // No more direct writes to it.
      ReadHeader(link);               // Expecting end of file.
      return;
  }
}

void Reader::OnTensor(const std::shared_ptr<InLink>& link) {
  const Tag tag = TagOf(link->header);
  if (config_.observer != nullptr) {
    config_.observer->OnReceived(link->rank, link->tensor.bytes());
  }
  absl::Status s = owner_->Deliver(tag, std::move(link->tensor), link->rank);
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

void Reader::BadFrame(const std::shared_ptr<InLink>& link,
                      const absl::Status& status) {
  CloseInLink(link);
  owner_->Observe(DataPlaneObserver::Error::kBadFrame);
  owner_->Fail(WithContext(
      status, absl::StrCat("rank ", config_.rank, ": frame from ",
                           owner_->Peer(link->rank, link->remote))));
}

void Reader::InLinkEnded(const std::shared_ptr<InLink>& link,
                         const asio::error_code& ec) {
  CloseInLink(link);
  if (ec == asio::error::operation_aborted || owner_->Closing()) return;
  if (link->said_goodbye && ec == asio::error::eof) return;
  owner_->Observe(DataPlaneObserver::Error::kPeerLost);
  owner_->Fail(absl::UnavailableError(absl::StrCat(
      "rank ", config_.rank, " lost the connection from ",
      owner_->Peer(link->rank, link->remote), ": ", ec.message())));
}

void Reader::CloseInLink(const std::shared_ptr<InLink>& link) {
  link->closed = true;
  asio::error_code ignored;
  link->socket.close(ignored);
  link->timer.cancel();
  in_.erase(link->id);
}

}  // namespace conveyor::transport::tcp_internal
