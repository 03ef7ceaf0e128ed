// MetricsServer: a daemon's --metrics-address. Serves Prometheus' text
// exposition format on GET /metrics from the collectables it is given (a
// prometheus::Registry, or a collector that reads the daemon's state at
// scrape time), and the probes of load balancers and Kubernetes:
//   /healthz  200 "ok" while the process serves HTTP at all (liveness);
//   /readyz   200 or 503 as the daemon's readiness check says, with its
//             reason as the body (readiness).
// Every other path is 404; see http_server.h for what the server refuses
// and how it bounds slow and idle clients.
//
// Binds exactly the address it is given ("host:port", IPv6 as "[::1]:port";
// port 0 picks a free port, see address()). The server runs its own
// threads, so a scrape never waits for the daemon's work and the daemon never
// waits for a scrape.
//
// Thread-safe.
#ifndef CONVEYOR_TELEMETRY_METRICS_SERVER_H_
#define CONVEYOR_TELEMETRY_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "telemetry/http_server.h"

namespace conveyor::telemetry {

// What /readyz answers: whether the daemon can do its work now, and a line
// that says why (or why not) for whoever reads the probe's output.
struct Readiness {
  bool ready = true;
  std::string detail;
};
// Called on the server's threads at each probe: thread-safe and quick.
using ReadinessCheck = std::function<Readiness()>;

class MetricsServer {
 public:
  // InvalidArgument for an address without a port; Unavailable when it cannot
  // be bound. The collectables must outlive the server or expire (they are
  // held weakly, as prometheus-cpp's own server did). Without a readiness
  // check, /readyz answers ready.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address,
      const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables,
      ReadinessCheck readiness = nullptr,
      const HttpServerOptions& options = {});

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" with the bound port: where to scrape.
  const std::string& address() const { return http_->address(); }
  HttpServerStats stats() const { return http_->stats(); }

 private:
  explicit MetricsServer(std::unique_ptr<HttpServer> http);

  std::unique_ptr<HttpServer> http_;
};

}  // namespace conveyor::telemetry

#endif  // CONVEYOR_TELEMETRY_METRICS_SERVER_H_
