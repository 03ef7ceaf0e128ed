// Dialer: opens a TcpChannel's send-side connections (OutLink) and watches
// them for loss. It dials a peer until it listens or the connect deadline
// passes (peers start at different times), sends the Hello, reads the
// HelloAck and turns a refusal into the status Connect returns. Once
// connected, it waits for the end of the stream: the peer never writes on
// this connection, so a completed read means it is gone (or broke the
// protocol).
//
// Threads: the channel's I/O thread only, and so are the Owner's methods
// it calls (Fail may be called from anywhere).
#ifndef CONVEYOR_TRANSPORT_TCP_INTERNAL_DIALER_H_
#define CONVEYOR_TRANSPORT_TCP_INTERNAL_DIALER_H_

#include <asio.hpp>  // ip::tcp, error_code
#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/internal/channel_owner.h"
#include "transport/tcp/internal/out_link.h"
#include "transport/tcp/internal/writer.h"
#include "transport/tcp/tcp_channel.h"

namespace conveyor::transport::tcp_internal {

class Dialer {
 public:
  // What the dialer needs from the channel that owns it.
  class Owner : public ChannelOwner {
   public:
    // `l`'s peer accepted the handshake.
    virtual void OnConnected(OutLink* l) = 0;
    // The connection to `l`'s peer ended with `ec`.
    virtual void OnLinkLost(OutLink* l, const asio::error_code& ec) = 0;
  };

  // `config`, `writer` and `owner` outlive the dialer.
  Dialer(const TcpChannelConfig& config, Writer* writer, Owner* owner);

  Dialer(const Dialer&) = delete;
  Dialer& operator=(const Dialer&) = delete;

  // Dials `l`'s peer at `endpoints` (in turn) until `deadline`. Ends in
  // Owner::OnConnected, or closes `l` and fails the channel: Unavailable
  // for a broken handshake, DeadlineExceeded past the deadline,
  // PermissionDenied or FailedPrecondition for a refusal. Does nothing
  // unless `l` is idle (the channel was aborted meanwhile).
  void Start(OutLink* l, std::vector<asio::ip::tcp::endpoint> endpoints,
             std::chrono::steady_clock::time_point deadline);

 private:
  // The status a peer's refusal (`result`) becomes, with `message`.
  static absl::Status HelloRejection(HelloResult result, std::string message);

  // Delay between dials while a peer is not listening yet.
  static constexpr std::chrono::milliseconds kRedialDelay{50};

  void Dial(OutLink* l);
  void HandshakeFailed(OutLink* l, const asio::error_code& ec);
  void OnHelloAck(OutLink* l, const asio::error_code& ec);
  void ConnectFailed(OutLink* l, const absl::Status& status);
  void WatchForLoss(OutLink* l);

  const TcpChannelConfig& config_;
  Writer* const writer_;
  Owner* const owner_;
};

}  // namespace conveyor::transport::tcp_internal

#endif  // CONVEYOR_TRANSPORT_TCP_INTERNAL_DIALER_H_
