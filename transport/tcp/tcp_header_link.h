// TcpHeaderLink: the HeaderLink (transport/nccl/header_link.h) an NCCL
// channel announces its tensors over, carried by the job's TcpChannel as
// message frames. The TcpChannel is connected anyway (it carries the
// gradient-norm reduction and is the fallback data plane), and its
// connections already keep each peer's messages in order, tell a lost peer
// from a goodbye, and are keyed by the job's secret.
//
// A failed TcpChannel (a peer lost, an abort) breaks the link to every
// peer: each gets OnLinkError with the channel's status code (Unavailable
// for a lost peer; an aborting rank's own code, carried by its abort
// frames, so the NCCL channel fails with the original reason's code).
//
// Thread-safe, as HeaderLink.
#ifndef CONVEYOR_TRANSPORT_TCP_TCP_HEADER_LINK_H_
#define CONVEYOR_TRANSPORT_TCP_TCP_HEADER_LINK_H_

#include <string>

#include "absl/status/status.h"
#include "transport/nccl/header_link.h"
#include "transport/tcp/tcp_channel.h"

namespace conveyor::transport {

class TcpHeaderLink final : public HeaderLink,
                            private TcpChannel::MessageHandler {
 public:
  // `channel` is connected (or about to be) and outlives the link; the link
  // must be stopped (or never started) before it is destroyed. `world_size`
  // is the channel's.
  TcpHeaderLink(TcpChannel* channel, int rank, int world_size);
  ~TcpHeaderLink() override;

  TcpHeaderLink(const TcpHeaderLink&) = delete;
  TcpHeaderLink& operator=(const TcpHeaderLink&) = delete;

  // HeaderLink.
  void Start(Receiver* receiver) override;
  absl::Status Send(int peer, std::string message) override;
  void Stop() override;

 private:
  // TcpChannel::MessageHandler, on the channel's I/O thread.
  void OnMessage(int from, std::string message) override;
  void OnChannelFailed(const absl::Status& status) override;

  TcpChannel* const channel_;
  const int rank_;
  const int world_size_;
  // Set by Start; callbacks only come between Start and Stop.
  Receiver* receiver_ = nullptr;
  bool started_ = false;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_TCP_TCP_HEADER_LINK_H_
