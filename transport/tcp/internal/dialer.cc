#include "transport/tcp/internal/dialer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/mailbox.h"  // WithContext

namespace conveyor::transport::tcp_internal {

using tcp = asio::ip::tcp;

Dialer::Dialer(const TcpChannelConfig& config, Writer* writer, Owner* owner)
    : config_(config), writer_(writer), owner_(owner) {}

absl::Status Dialer::HelloRejection(HelloResult result, std::string message) {
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

void Dialer::Start(OutLink* l, std::vector<tcp::endpoint> endpoints,
                   std::chrono::steady_clock::time_point deadline) {
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

void Dialer::Dial(OutLink* l) {
  if (l->state != OutLink::State::kConnecting) return;
  if (l->timed_out) {
    ConnectFailed(l, absl::DeadlineExceededError(absl::StrCat(
                         "rank ", config_.rank, " could not connect to ",
                         owner_->Peer(l->rank, ""), " within ",
                         config_.connect_timeout.count(),
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

void Dialer::HandshakeFailed(OutLink* l, const asio::error_code& ec) {
  if (l->timed_out) {
    l->last_error = "handshake not answered";
    Dial(l);  // Reports the deadline.
    return;
  }
  ConnectFailed(l, absl::UnavailableError(absl::StrCat(
                       "rank ", config_.rank, ": handshake with ",
                       owner_->Peer(l->rank, ""), " failed: ", ec.message())));
}

void Dialer::OnHelloAck(OutLink* l, const asio::error_code& ec) {
  if (l->state != OutLink::State::kConnecting) return;
  if (ec) return HandshakeFailed(l, ec);
  absl::StatusOr<HelloResult> result = DecodeHelloAck(l->ack);
  if (!result.ok()) {
    return ConnectFailed(
        l, WithContext(result.status(),
                       absl::StrCat("rank ", config_.rank, ": ",
                                    owner_->Peer(l->rank, ""), " answered")));
  }
  if (*result != HelloResult::kOk) {
    return ConnectFailed(
        l, HelloRejection(
               *result,
               absl::StrCat(owner_->Peer(l->rank, ""),
                            " refused the connection from rank ", config_.rank,
                            ": ", HelloResultName(*result))));
  }
  l->state = OutLink::State::kReady;
  l->deadline.cancel();
  WatchForLoss(l);
  owner_->OnConnected(l);
  writer_->MaybeWrite(l);
}

void Dialer::ConnectFailed(OutLink* l, const absl::Status& status) {
  writer_->Close(l);
  owner_->Fail(status);
}

void Dialer::WatchForLoss(OutLink* l) {
  l->socket.async_read_some(
      asio::buffer(&l->probe, 1),
      [this, l](const asio::error_code& ec, size_t) {
        if (l->state == OutLink::State::kClosed) return;
        if (!ec) {
          writer_->Close(l);
          owner_->Fail(absl::InvalidArgumentError(absl::StrCat(
              "rank ", config_.rank, ": ", owner_->Peer(l->rank, ""),
              " wrote on a send-only connection")));
          return;
        }
        owner_->OnLinkLost(l, ec);
      });
}

}  // namespace conveyor::transport::tcp_internal
