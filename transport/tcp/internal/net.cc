#include "transport/tcp/internal/net.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace conveyor::transport::tcp_internal {

using tcp = asio::ip::tcp;

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

}  // namespace conveyor::transport::tcp_internal
