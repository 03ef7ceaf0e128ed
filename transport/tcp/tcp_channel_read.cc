#include "transport/tcp/tcp_channel_impl.h"

namespace conveyor::transport {

void TcpChannel::Impl::StartAccept() {
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

void TcpChannel::Impl::StartHandshake(const std::shared_ptr<InLink>& link) {
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
HelloResult TcpChannel::Impl::Judge(const Hello& hello) const {
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
void TcpChannel::Impl::Reject(const std::shared_ptr<InLink>& link,
                              absl::string_view why, bool close /*= true*/) {
  rejected_.fetch_add(1);
  Observe(DataPlaneObserver::Error::kRejected);
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

void TcpChannel::Impl::ReadHeader(const std::shared_ptr<InLink>& link) {
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

void TcpChannel::Impl::OnHeader(const std::shared_ptr<InLink>& link) {
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
      if (IsHost(backend_)) HintHugePages(link->tensor.raw(), h.payload_bytes);
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

void TcpChannel::Impl::OnTensor(const std::shared_ptr<InLink>& link) {
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

void TcpChannel::Impl::BadFrame(const std::shared_ptr<InLink>& link,
                                const absl::Status& status) {
  CloseInLink(link);
  Observe(DataPlaneObserver::Error::kBadFrame);
  Fail(WithContext(status, absl::StrCat("rank ", config_.rank, ": frame from ",
                                        Peer(link->rank, link->remote))));
}

void TcpChannel::Impl::InLinkEnded(const std::shared_ptr<InLink>& link,
                                   const asio::error_code& ec) {
  CloseInLink(link);
  if (ec == asio::error::operation_aborted || closing_) return;
  if (link->said_goodbye && ec == asio::error::eof) return;
  Observe(DataPlaneObserver::Error::kPeerLost);
  Fail(absl::UnavailableError(
      absl::StrCat("rank ", config_.rank, " lost the connection from ",
                   Peer(link->rank, link->remote), ": ", ec.message())));
}

void TcpChannel::Impl::CloseInLink(const std::shared_ptr<InLink>& link) {
  link->closed = true;
  asio::error_code ignored;
  link->socket.close(ignored);
  link->timer.cancel();
  in_.erase(link->id);
}

}  // namespace conveyor::transport
