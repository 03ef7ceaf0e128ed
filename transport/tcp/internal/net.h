// Asio helpers the TcpChannel's parts share: "host:port" parsing and
// resolution, printable peer endpoints, and a completion condition that lets
// one system call move a whole tensor. Internal to transport/tcp.
//
// Thread-safe: every function is stateless (Resolve uses an io_context of
// its own, so it may run on any thread, before or beside the I/O thread).
#ifndef CONVEYOR_TRANSPORT_TCP_INTERNAL_NET_H_
#define CONVEYOR_TRANSPORT_TCP_INTERNAL_NET_H_

#include <asio.hpp>  // ip::tcp, error_code
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::transport::tcp_internal {

// Splits "host:port" or "[v6]:port" (brackets dropped) into its parts; the
// port comes back as a decimal number in 0..65535. InvalidArgument ("address
// '...' is not host:port") for anything else.
absl::Status SplitHostPort(absl::string_view address, std::string* host,
                           std::string* port);

// The endpoints `address` ("host:port", numeric port) resolves to; `passive`
// for an address to listen on. InvalidArgument when it does not parse or
// resolves to nothing.
absl::StatusOr<std::vector<asio::ip::tcp::endpoint>> Resolve(
    absl::string_view address, bool passive);

// "ip:port" of the socket's peer, or "unknown address".
std::string EndpointString(const asio::ip::tcp::socket& socket);

// asio's transfer_all caps every read and write system call at 64 KiB; this
// lets one call move as much of a tensor as the socket buffers take, which
// is what keeps a transfer near raw socket speed.
struct TransferAllUnbounded {
  size_t operator()(const asio::error_code& ec, size_t /*done*/) const {
    return ec ? 0 : std::numeric_limits<size_t>::max();
  }
};

}  // namespace conveyor::transport::tcp_internal

#endif  // CONVEYOR_TRANSPORT_TCP_INTERNAL_NET_H_
