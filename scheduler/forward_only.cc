#include "scheduler/forward_only.h"

#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace conveyor::scheduler {

absl::StatusOr<Schedule> GenerateForwardOnly(ScheduleKind kind,
                                             const ScheduleOptions& o) {
  const absl::string_view name = ScheduleKindName(kind);
  if (o.ranks < 1 || o.ranks > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks (stages P) must be in 1..", kMaxRanks, ", got ", o.ranks));
  }
  if (o.microbatches < 1 || o.microbatches > kMaxMicrobatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatches (M) must be in 1..", kMaxMicrobatches,
                     ", got ", o.microbatches));
  }
  const Placement placement = PlacementOf(kind);
  if (placement == Placement::kV
          ? o.virtual_stages != 2
          : (o.virtual_stages < 1 || o.virtual_stages > kMaxVirtualStages ||
             (o.virtual_stages > 1 && !TakesVirtualStages(kind)))) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual stages (V) = ", o.virtual_stages, " is not one ",
                     name, " runs"));
  }
  const int64_t cells =
      static_cast<int64_t>(o.ranks) * o.virtual_stages * o.microbatches;
  if (cells > kMaxStageMicrobatches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "P*V*M = ", cells, " stage-microbatches is too large (at most ",
        kMaxStageMicrobatches, ")"));
  }

  Schedule s;
  s.kind = kind;
  s.ranks = o.ranks;
  s.virtual_stages = o.virtual_stages;
  s.microbatches = o.microbatches;
  s.placement = placement;
  s.forward_only = true;
  s.actions.resize(o.ranks);
  const int p = o.ranks, m = o.microbatches, stages = s.num_stages();
  for (auto& program : s.actions) {
    program.reserve(static_cast<size_t>(cells / p));
  }

  // Ready forwards per rank, lowest (microbatch, stage) first.
  using Key = std::pair<int, int>;
  std::vector<std::priority_queue<Key, std::vector<Key>, std::greater<Key>>>
      ready(p);
  for (int mb = 0; mb < m; ++mb) ready[s.RankOfStage(0)].push({mb, 0});
  int64_t left = cells;
  std::vector<Key> done_this_tick;
  while (left > 0) {
    done_this_tick.clear();
    for (int r = 0; r < p; ++r) {
      if (ready[r].empty()) continue;
      const auto [mb, stage] = ready[r].top();
      ready[r].pop();
      s.actions[r].push_back({Op::kForward, stage, mb});
      done_this_tick.push_back({mb, stage});
      --left;
    }
    // Outputs are ready from the next tick on.
    for (const auto& [mb, stage] : done_this_tick) {
      if (stage + 1 < stages) {
        ready[s.RankOfStage(stage + 1)].push({mb, stage + 1});
      }
    }
  }
  return s;
}

}  // namespace conveyor::scheduler
