#include "scheduler/forward_only.h"

#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

namespace conveyor::scheduler {

absl::StatusOr<Schedule> GenerateForwardOnly(ScheduleKind kind,
                                             const ScheduleOptions& o) {
  if (absl::Status s = CheckScheduleOptions(kind, o, /*forward_only=*/true);
      !s.ok()) {
    return s;
  }
  const int64_t cells =
      static_cast<int64_t>(o.ranks) * o.virtual_stages * o.microbatches;
  Schedule s = EmptySchedule(kind, o);
  s.forward_only = true;
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
