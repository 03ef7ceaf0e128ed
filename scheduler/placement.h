// Stage placement: which rank holds each of a pipeline's P*V stages. It is
// part of a schedule (Schedule::placement), chosen by its kind, so the
// validator, simulator, planner, executor and checkpoint layout all read the
// same map.
//   loop: stage s on rank s mod P. With V > 1 each rank holds every P-th
//         stage (Megatron-style virtual stages).
//   v:    chunk c = s / P runs down the ranks when c is even and back up when
//         it is odd: rank (s mod P) or P-1 - (s mod P). With V = 2, rank r
//         holds stages r and 2P-1-r, so the first and the last stage (the
//         embedding and the loss) share rank 0, and each chunk boundary is a
//         local hand-off (ZB-V, DualPipeV).
// Pure functions; thread-safe.
#ifndef CONVEYOR_SCHEDULER_PLACEMENT_H_
#define CONVEYOR_SCHEDULER_PLACEMENT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::scheduler {

enum class Placement : unsigned char { kLoop, kV };

// "loop", "v".
absl::string_view PlacementName(Placement placement);

// Inverse of PlacementName. InvalidArgument lists the allowed names.
absl::StatusOr<Placement> ParsePlacement(absl::string_view name);

// The rank that holds `stage` (0 <= stage) of a pipeline over `ranks` ranks.
inline int StageRank(Placement placement, int stage, int ranks) {
  const int chunk = stage / ranks, i = stage % ranks;
  return placement == Placement::kV && chunk % 2 == 1 ? ranks - 1 - i : i;
}

// The stages `rank` holds out of `num_stages`, ascending.
std::vector<int> StagesOfRank(Placement placement, int rank, int ranks,
                              int num_stages);

// The other ranks `rank` exchanges activations or gradients with: the holders
// of the stages next to its own, ascending.
std::vector<int> NeighbourRanks(Placement placement, int rank, int ranks,
                                int num_stages);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_PLACEMENT_H_
