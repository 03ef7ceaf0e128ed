#include "cli/core_shares.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cpu_set.h"

namespace conveyor::cli {

CoreShares PlanCoreShares(const CoreShareRequest& request) {
  CoreShares out;
  const bool cpu = std::all_of(
      request.devices.begin(), request.devices.end(),
      [](const std::string& d) { return absl::StartsWith(d, "cpu"); });
  if (!cpu) {
    out.description = "on the devices given";
    return out;
  }
  const std::vector<std::vector<int>> shares =
      SplitCpus(request.cores, request.workers);
  const int share = shares.empty() ? 1 : static_cast<int>(shares[0].size());
  if (request.devices.empty()) {
    // A mesh of devices_per_stage devices splits the worker's share.
    const int mesh = std::max(1, request.devices_per_stage);
    const int per_device = std::max(1, share / mesh);
    out.worker_devices = {absl::StrJoin(
        std::vector<std::string>(mesh, absl::StrCat("cpu:", per_device)), ",")};
  }
  const char* cores_word = share == 1 ? " core" : " cores";
  if (shares.empty()) {
    out.description =
        absl::StrCat(request.workers, " workers sharing ", request.cores.size(),
                     " core(s): 1 thread each, not pinned");
    return out;
  }
  if (!request.pin) {
    out.description =
        absl::StrCat(share, cores_word, " each, not pinned (--no-pin)");
    return out;
  }
  for (const std::vector<int>& s : shares) {
    out.worker_cpu_cores.push_back(FormatCpuList(s));
  }
  out.description = absl::StrCat(share, cores_word, " each, pinned to ",
                                 absl::StrJoin(out.worker_cpu_cores, " | "));
  return out;
}

}  // namespace conveyor::cli
