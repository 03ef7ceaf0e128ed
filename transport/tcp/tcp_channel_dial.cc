#include "transport/tcp/tcp_channel_impl.h"

namespace conveyor::transport {

void TcpChannel::Impl::StartConnect(OutLink* l,
                                    std::vector<tcp::endpoint> endpoints,
                                    Clock::time_point deadline) {
  if (l->state != OutLink::State::kIdle) return;  // Aborted meanwhile.
  l->state = OutLink::State::kConnecting;
  l->endpoints = std::move(endpoints);
  l->deadline.expires_at(deadline);
  l->deadline.async_wait([l](const asio::error_code& ec) {
    if (ec || l->state != OutLink::State::kConnecting) return;
    // Whatever is pending (dial, redial delay, handshake) fails now.
    l->timed_out = true;
    asio::error_code ignored;
    l->socket.close(ignored);
    l->timer.cancel();
  });
  Dial(l);
}

void TcpChannel::Impl::Dial(OutLink* l) {
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

void TcpChannel::Impl::HandshakeFailed(OutLink* l, const asio::error_code& ec) {
  if (l->timed_out) {
    l->last_error = "handshake not answered";
    Dial(l);  // Reports the deadline.
    return;
  }
  ConnectFailed(l, absl::UnavailableError(absl::StrCat(
                       "rank ", config_.rank, ": handshake with ",
                       Peer(l->rank, ""), " failed: ", ec.message())));
}

void TcpChannel::Impl::OnHelloAck(OutLink* l, const asio::error_code& ec) {
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
                            " refused the connection from rank ", config_.rank,
                            ": ", HelloResultName(*result))));
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

void TcpChannel::Impl::ConnectFailed(OutLink* l, const absl::Status& status) {
  CloseOutLink(l);
  Fail(status);
}

// The peer never writes on this connection after its HelloAck, so a
// completed read means it is gone (or broke the protocol).
void TcpChannel::Impl::WatchForLoss(OutLink* l) {
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
void TcpChannel::Impl::OutLinkLost(OutLink* l, const asio::error_code& ec) {
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
  // The peer's abort may sit behind as much as its linger lets it flush.
  ReportLossAfterGrace(l, undelivered, std::move(reason),
                       Clock::now() + kPeerLossGrace + config_.linger);
}

void TcpChannel::Impl::ReportLossAfterGrace(OutLink* l, bool undelivered,
                                            std::string reason,
                                            Clock::time_point give_up) {
  l->timer.expires_after(kPeerLossGrace);
  l->timer.async_wait([this, l, undelivered, reason = std::move(reason),
                       give_up](const asio::error_code& timer_ec) mutable {
    if (timer_ec) return;  // Closing: nothing to report.
    if (said_goodbye_[l->rank] && !undelivered) return;
    if (InLinkOpenFrom(l->rank) && Clock::now() < give_up) {
      ReportLossAfterGrace(l, undelivered, std::move(reason), give_up);
      return;
    }
    Observe(DataPlaneObserver::Error::kPeerLost);
    Fail(absl::UnavailableError(reason));
  });
}

bool TcpChannel::Impl::InLinkOpenFrom(int rank) const {
  return std::any_of(in_.begin(), in_.end(), [rank](const auto& entry) {
    return entry.second->rank == rank && !entry.second->closed;
  });
}

}  // namespace conveyor::transport
