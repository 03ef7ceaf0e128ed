#include "transport/tcp/tcp_header_link.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace conveyor::transport {

TcpHeaderLink::TcpHeaderLink(TcpChannel* channel, int rank, int world_size)
    : channel_(channel), rank_(rank), world_size_(world_size) {}

TcpHeaderLink::~TcpHeaderLink() { Stop(); }

void TcpHeaderLink::Start(Receiver* receiver) {
  if (started_) return;
  started_ = true;
  receiver_ = receiver;
  channel_->SetMessageHandler(this);
}

absl::Status TcpHeaderLink::Send(int peer, std::string message) {
  absl::Status s = channel_->SendMessage(peer, std::move(message));
  if (s.ok() || s.code() == absl::StatusCode::kInvalidArgument) return s;
  // The channel failed or is not connected: the link to `peer` is broken.
  return absl::UnavailableError(absl::StrCat("rank ", rank_,
                                             ": the header link to rank ", peer,
                                             " is broken: ", s.message()));
}

void TcpHeaderLink::Stop() {
  if (!started_) return;
  // Returns once no callback runs; none starts afterwards.
  channel_->SetMessageHandler(nullptr);
  started_ = false;
}

void TcpHeaderLink::OnMessage(int from, std::string message) {
  receiver_->OnMessage(from, std::move(message));
}

void TcpHeaderLink::OnChannelFailed(const absl::Status& status) {
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    // The channel's code: Unavailable for a lost peer, the aborting
    // rank's own code when an abort broke the channel.
    receiver_->OnLinkError(
        peer,
        absl::Status(status.code(),
                     absl::StrCat("rank ", rank_, ": the header link to rank ",
                                  peer, " is broken: ", status.message())));
  }
}

}  // namespace conveyor::transport
