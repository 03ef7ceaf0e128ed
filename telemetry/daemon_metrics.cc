#include "telemetry/daemon_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "common/build_info.h"
#include "prometheus/gauge.h"

namespace conveyor::telemetry {
namespace {

prometheus::MetricFamily GaugeFamily(
    const std::string& name, const std::string& help, double value,
    prometheus::MetricType type = prometheus::MetricType::Gauge) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
  return family;
}

int CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // Not the descriptor opendir itself holds.
}

}  // namespace

const prometheus::Histogram::BucketBoundaries& DurationBuckets() {
  static const auto* const kBuckets =
      new prometheus::Histogram::BucketBoundaries{
          0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1,      2.5,   5,      10,    25,   50,    100};
  return *kBuckets;
}

void AddBuildInfo(prometheus::Registry& registry,
                  const std::string& component) {
  prometheus::BuildGauge()
      .Name("conveyor_build_info")
      .Help("Always 1; the labels say which build this daemon runs")
      .Register(registry)
      .Add({{"version", kVersion},
            {"revision", kGitRevision},
            {"component", component}})
      .Set(1);
}

void AddCertificateExpiry(prometheus::Registry& registry,
                          const std::string& flag, const std::string& file,
                          const std::string& subject, int64_t not_after_unix) {
  prometheus::BuildGauge()
      .Name("conveyor_tls_certificate_expiry_timestamp_seconds")
      .Help(
          "Unix time at which a certificate this daemon was started with "
          "(--tls-cert, or each of --tls-ca's) stops being valid")
      .Register(registry)
      .Add({{"flag", flag}, {"file", file}, {"subject", subject}})
      .Set(static_cast<double>(not_after_unix));
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  // /proc/self/stat: fields 14 and 15 are utime and stime (clock ticks), 20
  // num_threads, 22 starttime (ticks after boot), 23 vsize (bytes), 24 rss
  // (pages). The command name (field 2) may hold spaces, so fields are
  // counted after its closing parenthesis.
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)),
                   std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  std::vector<double> f;  // f[0] is field 3 (state, not a number: 0)
  if (paren != std::string::npos && paren + 2 <= text.size()) {
    std::istringstream fields(text.substr(paren + 2));
    for (std::string word; fields >> word;) {
      double value = 0;
      f.push_back(absl::SimpleAtod(word, &value) ? value : 0);
    }
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (f.size() > 21) {
    out.push_back(GaugeFamily(
        "process_cpu_seconds_total", "User and system CPU time of the daemon",
        (f[11] + f[12]) / ticks, prometheus::MetricType::Counter));
    out.push_back(
        GaugeFamily("process_threads", "Threads of the daemon", f[17]));
    out.push_back(GaugeFamily("process_virtual_memory_bytes",
                              "Virtual memory size of the daemon in bytes",
                              f[20]));
    out.push_back(
        GaugeFamily("process_resident_memory_bytes",
                    "Resident set size of the daemon in bytes",
                    f[21] * static_cast<double>(sysconf(_SC_PAGESIZE))));
    double boot_time = 0;
    std::ifstream proc_stat("/proc/stat");
    for (std::string key; proc_stat >> key;) {
      if (key == "btime") {
        proc_stat >> boot_time;
        break;
      }
    }
    out.push_back(GaugeFamily("process_start_time_seconds",
                              "Unix time the daemon started",
                              boot_time + f[19] / ticks));
  }
  if (const int fds = CountOpenFds(); fds >= 0) {
    out.push_back(GaugeFamily("process_open_fds",
                              "Open file descriptors of the daemon", fds));
  }
  if (rlimit limit{}; getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
                      limit.rlim_cur != RLIM_INFINITY) {
    out.push_back(GaugeFamily("process_max_fds",
                              "The daemon's limit on open file descriptors",
                              static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

}  // namespace conveyor::telemetry
