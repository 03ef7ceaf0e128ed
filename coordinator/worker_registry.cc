#include "coordinator/worker_registry.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/printable.h"
#include "coordinator/ids.h"
#include "proto/protocol.h"

namespace conveyor::coordinator {
namespace {

// Names are shown in listings, logs and metric labels.
constexpr size_t kMaxWorkerNameBytes = 253;

}  // namespace

absl::Status WorkerRegistry::CheckRequest(
    const v1::RegisterRequest& request) const {
  if (request.protocol_version() != proto::kProtocolVersion ||
      (!version_.empty() && request.version() != version_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version skew: worker '", request.name(), "' runs Conveyor ",
        request.version(), " (control protocol ", request.protocol_version(),
        "), this coordinator runs ", version_, " (control protocol ",
        proto::kProtocolVersion,
        "); run the same Conveyor release on the coordinator and every "
        "worker"));
  }
  if (request.name().empty() || request.devices().empty()) {
    return absl::InvalidArgumentError(
        "registration needs a worker name and at least one device");
  }
  // No control characters (they would rewrite a terminal) and a bounded
  // length.
  if (request.name().size() > kMaxWorkerNameBytes ||
      HasControlCharacters(request.name())) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker name must be 1 to ", kMaxWorkerNameBytes,
                     " characters without control characters; got ",
                     absl::CHexEscape(request.name().substr(0, 64))));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerRecord*> WorkerRegistry::Add(
    const v1::RegisterRequest& request,
    std::shared_ptr<WorkerConnection> connection, TimePoint now,
    int64_t now_unix_ms) {
  // Two live workers of one name could not be told apart in listings,
  // metrics or a drain.
  for (const auto& [n, other] : workers_) {
    if (other.info.state() != v1::LOST && other.info.name() == request.name()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker name '", request.name(), "' is taken by ", other.info.id(),
          ", which is live; give each worker its own --name (the default "
          "is host:pid)"));
    }
  }
  // The worker is back under its name: its LOST record would only keep a
  // `worker lost` alert firing (conveyor_workers{state="lost"}) for a worker
  // that is there. And lost records are capped, oldest first, so workers
  // that come and go under new names (pods) do not grow the registry, the
  // listings and the state gauges without bound.
  std::vector<int64_t> lost;
  for (const auto& [n, other] : workers_) {
    if (other.info.state() == v1::LOST) lost.push_back(n);
  }
  size_t kept = lost.size();
  for (int64_t n : lost) {
    if (workers_.at(n).info.name() == request.name() ||
        kept > kMaxLostWorkers - 1) {
      workers_.erase(n);
      --kept;
    }
  }
  const int64_t number = next_++;
  WorkerRecord& w = workers_[number];
  w.info.set_id(WorkerId(number));
  w.info.set_name(request.name());
  w.info.set_version(request.version());
  *w.info.mutable_devices() = request.devices();
  w.info.set_data_address(request.data_address());
  w.info.set_metrics_address(request.metrics_address());
  // A NaN or negative peak (a skewed or hostile worker) is unknown.
  w.info.set_peak_flops_per_device(
      request.peak_flops_per_device() > 0 &&
              std::isfinite(request.peak_flops_per_device())
          ? request.peak_flops_per_device()
          : 0);
  w.info.set_state(v1::IDLE);
  w.info.set_registered_unix_ms(now_unix_ms);
  w.connection = std::move(connection);
  w.last_seen = now;
  return &w;
}

WorkerRecord* WorkerRegistry::Find(const std::string& id) {
  auto it = workers_.find(WorkerNumber(id));
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerRecord* WorkerRegistry::Find(const std::string& id) const {
  auto it = workers_.find(WorkerNumber(id));
  return it == workers_.end() ? nullptr : &it->second;
}

void WorkerRegistry::Erase(const std::string& id) {
  workers_.erase(WorkerNumber(id));
}

int WorkerRegistry::Live(int64_t min_devices) const {
  int n = 0;
  for (const auto& [number, w] : workers_) {
    if (w.info.state() != v1::LOST && !w.info.draining() &&
        w.info.devices_size() >= min_devices) {
      ++n;
    }
  }
  return n;
}

std::vector<WorkerRecord*> WorkerRegistry::Idle(int64_t min_devices) {
  std::vector<WorkerRecord*> idle;
  for (auto& [number, w] : workers_) {
    if (w.info.state() == v1::IDLE && !w.info.draining() &&
        w.info.devices_size() >= min_devices) {
      idle.push_back(&w);
    }
  }
  return idle;
}

std::vector<WorkerRecord*> WorkerRegistry::Silent(TimePoint now,
                                                  Duration timeout) {
  std::vector<WorkerRecord*> silent;
  for (auto& [number, w] : workers_) {
    if (w.info.state() != v1::LOST && now - w.last_seen > timeout) {
      silent.push_back(&w);
    }
  }
  return silent;
}

void WorkerRegistry::DiscountStall(Duration gap, TimePoint now) {
  for (auto& [number, w] : workers_) {
    w.last_seen = std::min(now, w.last_seen + gap);
  }
}

std::vector<const WorkerRecord*> WorkerRegistry::All() const {
  std::vector<const WorkerRecord*> all;
  for (const auto& [number, w] : workers_) all.push_back(&w);
  return all;
}

}  // namespace conveyor::coordinator
