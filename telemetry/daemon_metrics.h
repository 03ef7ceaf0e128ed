// What both daemons export besides their own metrics: build information and
// the process's CPU time, memory, open file descriptors, threads and start
// time (read from /proc at scrape time, so they cost nothing in between),
// plus the bucket layout every duration histogram shares.
#ifndef CONVEYOR_TELEMETRY_DAEMON_METRICS_H_
#define CONVEYOR_TELEMETRY_DAEMON_METRICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace conveyor::telemetry {

// 100 µs to 100 s in steps of about 2.5: one layout for every duration, so
// dashboards can aggregate histograms across metrics.
const prometheus::Histogram::BucketBoundaries& DurationBuckets();

// Adds conveyor_build_info{version, revision, component} = 1 to `registry`.
void AddBuildInfo(prometheus::Registry& registry, const std::string& component);

// Adds conveyor_tls_certificate_expiry_timestamp_seconds{flag, file,
// subject} = `not_after_unix` (when the certificate stops being valid) to
// `registry`, one series per certificate a daemon was started with, so an
// alert fires before it expires (deploy/prometheus/alerts.yml).
void AddCertificateExpiry(prometheus::Registry& registry,
                          const std::string& flag, const std::string& file,
                          const std::string& subject, int64_t not_after_unix);

// The process_* series of the calling process, under the names every
// Prometheus client library and stock dashboard use (process_cpu_seconds_total,
// process_resident_memory_bytes, process_open_fds, process_max_fds, ...).
class ProcessCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace conveyor::telemetry

#endif  // CONVEYOR_TELEMETRY_DAEMON_METRICS_H_
