// MetricsServer: serves Prometheus' text exposition format on GET /metrics
// at a daemon's --metrics-address, from the collectables it is given (a
// prometheus::Registry, or a collector that reads the daemon's state at
// scrape time).
//
// Binds exactly the address it is given ("host:port", IPv6 as "[::1]:port";
// port 0 picks a free port, see address()). The HTTP server (civetweb,
// through prometheus-cpp) runs its own two threads, so a scrape never waits
// for the daemon's work and the daemon never waits for a scrape.
//
// Thread-safe.
#ifndef CONVEYOR_TELEMETRY_METRICS_SERVER_H_
#define CONVEYOR_TELEMETRY_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

namespace prometheus {
class Exposer;
}

namespace conveyor::telemetry {

class MetricsServer {
 public:
  // InvalidArgument for an address without a port; Unavailable when it cannot
  // be bound. The collectables must outlive the server or expire (they are
  // held weakly, as prometheus-cpp does).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address,
      const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables);

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" with the bound port: where to scrape.
  const std::string& address() const { return address_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                std::string address);

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

}  // namespace conveyor::telemetry

#endif  // CONVEYOR_TELEMETRY_METRICS_SERVER_H_
