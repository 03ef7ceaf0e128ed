// ChannelOwner: what every part of a TcpChannel (Dialer, Reader, Writer)
// needs from the channel that owns it; each part's Owner adds its own.
//
// Threads: called on the channel's I/O thread, as the parts are.
#ifndef CONVEYOR_TRANSPORT_TCP_INTERNAL_CHANNEL_OWNER_H_
#define CONVEYOR_TRANSPORT_TCP_INTERNAL_CHANNEL_OWNER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace conveyor::transport::tcp_internal {

class ChannelOwner {
 public:
  virtual ~ChannelOwner() = default;
  // "rank R (address)", for error messages.
  virtual std::string Peer(int rank,
                           absl::string_view fallback_address) const = 0;
  // Aborts the channel with `status`.
  virtual void Fail(const absl::Status& status) = 0;
};

}  // namespace conveyor::transport::tcp_internal

#endif  // CONVEYOR_TRANSPORT_TCP_INTERNAL_CHANNEL_OWNER_H_
