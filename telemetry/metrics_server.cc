#include "telemetry/metrics_server.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace conveyor::telemetry {
namespace {

HttpResponse Scrape(
    const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& weak : collectables) {
    const std::shared_ptr<prometheus::Collectable> collectable = weak.lock();
    if (collectable == nullptr) continue;  // its owner is gone
    std::vector<prometheus::MetricFamily> more = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return {200, "text/plain; version=0.0.4; charset=utf-8",
          prometheus::TextSerializer().Serialize(families)};
}

}  // namespace

MetricsServer::MetricsServer(std::unique_ptr<HttpServer> http)
    : http_(std::move(http)) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address,
    const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables,
    ReadinessCheck readiness, const HttpServerOptions& options) {
  std::map<std::string, HttpHandler> routes;
  routes["/metrics"] = [collectables] { return Scrape(collectables); };
  routes["/healthz"] = [] { return HttpResponse{200, "text/plain", "ok\n"}; };
  routes["/readyz"] = [readiness = std::move(readiness)] {
    const Readiness now = readiness ? readiness() : Readiness{true, ""};
    return HttpResponse{
        now.ready ? 200 : 503, "text/plain; charset=utf-8",
        absl::StrCat(now.ready ? "ready" : "not ready",
                     now.detail.empty() ? "" : ": ", now.detail, "\n")};
  };
  absl::StatusOr<std::unique_ptr<HttpServer>> http =
      HttpServer::Start(address, std::move(routes), options);
  if (!http.ok()) {
    const std::string why(http.status().message());
    if (absl::IsInvalidArgument(http.status())) {
      return absl::InvalidArgumentError(absl::StrCat("metrics ", why));
    }
    return absl::UnavailableError(absl::StrCat("cannot serve metrics: ", why));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(*std::move(http)));
}

}  // namespace conveyor::telemetry
