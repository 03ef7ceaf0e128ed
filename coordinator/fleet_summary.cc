#include "coordinator/fleet_summary.h"

#include "absl/strings/str_cat.h"

namespace conveyor::coordinator {
namespace {

std::string Count(int n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

}  // namespace

std::string FleetSummary(const std::vector<v1::Worker>& workers,
                         const std::vector<v1::Job>& jobs) {
  int idle = 0, busy = 0, lost = 0;
  for (const v1::Worker& worker : workers) {
    switch (worker.state()) {
      case v1::IDLE:
        ++idle;
        break;
      case v1::BUSY:
        ++busy;
        break;
      case v1::LOST:
        ++lost;
        break;
      default:
        break;
    }
  }
  int queued = 0, running = 0;
  for (const v1::Job& job : jobs) {
    if (job.state() == v1::QUEUED) ++queued;
    if (job.state() == v1::PLANNING || job.state() == v1::RUNNING) ++running;
  }
  std::string line =
      absl::StrCat(Count(static_cast<int>(workers.size()), "worker", "workers"),
                   " (", idle, " idle, ", busy, " busy");
  if (lost > 0) absl::StrAppend(&line, ", ", lost, " lost");
  absl::StrAppend(&line, "); ", Count(running, "job", "jobs"), " running, ",
                  queued, " queued");
  return line;
}

}  // namespace conveyor::coordinator
