#include "telemetry/metrics_server.h"

#include <exception>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace conveyor::telemetry {

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                             std::string address)
    : exposer_(std::move(exposer)), address_(std::move(address)) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address,
    const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535 || (address.front() == '[') != (address[colon - 1] == ']')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", address,
        "\": expected host:port (IPv6 as [::1]:port; port 0 picks one)"));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports a failed bind by throwing (civetweb's
  // CivetException); it must not cross into the daemons.
  try {
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "2"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what(),
                     " (is the address in use or not local?)"));
  }
  for (const auto& collectable : collectables) {
    exposer->RegisterCollectable(collectable);
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": nothing bound"));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(
      std::move(exposer),
      absl::StrCat(address.substr(0, colon + 1), ports.front())));
}

}  // namespace conveyor::telemetry
