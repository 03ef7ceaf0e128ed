#include "coordinator/data_plane_choice.h"

#include <map>

#include "absl/strings/str_cat.h"

namespace conveyor::coordinator {
namespace {

DataPlaneChoice Tcp(const std::string& why) {
  return {.nccl = false, .description = absl::StrCat("tcp (", why, ")")};
}

}  // namespace

DataPlaneChoice ChooseDataPlane(const std::vector<v1::JobReady>& ready) {
  if (ready.size() < 2) return Tcp("one rank: nothing travels");
  std::map<std::string, int> rank_of_gpu;
  for (int r = 0; r < static_cast<int>(ready.size()); ++r) {
    const v1::JobReady& rank = ready[r];
    if (rank.device_uuid().empty()) {
      return Tcp(absl::StrCat("rank ", r, " runs on the CPU"));
    }
    if (!rank.nccl()) {
      return Tcp(absl::StrCat("rank ", r, "'s worker has no NCCL"));
    }
    auto [it, inserted] = rank_of_gpu.emplace(rank.device_uuid(), r);
    if (!inserted) {
      return Tcp(absl::StrCat("ranks ", it->second, " and ", r, " share GPU ",
                              rank.device_uuid()));
    }
  }
  return {.nccl = true, .description = "nccl"};
}

}  // namespace conveyor::coordinator
