#include "scheduler/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace conveyor::scheduler {

absl::string_view PlacementName(Placement placement) {
  return placement == Placement::kV ? "v" : "loop";
}

absl::StatusOr<Placement> ParsePlacement(absl::string_view name) {
  for (Placement p : {Placement::kLoop, Placement::kV}) {
    if (PlacementName(p) == name) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown placement '", name, "'; allowed: loop, v"));
}

std::vector<int> StagesOfRank(Placement placement, int rank, int ranks,
                              int num_stages) {
  std::vector<int> stages;
  for (int s = 0; s < num_stages; ++s) {
    if (StageRank(placement, s, ranks) == rank) stages.push_back(s);
  }
  return stages;
}

std::vector<int> NeighbourRanks(Placement placement, int rank, int ranks,
                                int num_stages) {
  std::vector<int> peers;
  for (int s : StagesOfRank(placement, rank, ranks, num_stages)) {
    for (int next : {s - 1, s + 1}) {
      if (next < 0 || next >= num_stages) continue;
      const int peer = StageRank(placement, next, ranks);
      if (peer != rank) peers.push_back(peer);
    }
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

}  // namespace conveyor::scheduler
