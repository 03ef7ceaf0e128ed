// The coordinator's scheduling policy as pure functions, apart from the
// Placer that applies them (coordinator/placer.h), so that each is tested
// on its own: per-owner quotas of workers (--owner-quota) and the choice of
// the jobs a blocked job of higher priority preempts. The queue's order and
// aging are coordinator/job_queue.h; what users see is docs/jobs.md
// "Priority and owner".
//
// Thread-safe (pure functions).
#ifndef CONVEYOR_COORDINATOR_SCHEDULING_POLICY_H_
#define CONVEYOR_COORDINATOR_SCHEDULING_POLICY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::coordinator {

// Workers each owner's placed jobs may hold at once, by owner. An owner
// not listed (and a job without one) has no limit.
using OwnerQuotas = std::map<std::string, int>;

// Parses --owner-quota's value, "team-a=16,team-b=8" (empty: no quotas).
// InvalidArgument naming the bad entry and what is expected: an owner
// name as a job's `owner:` takes it (job/job_policy.h), given once, and a
// positive number of workers.
absl::StatusOr<OwnerQuotas> ParseOwnerQuotas(absl::string_view text);

// A placed job that a higher-priority one may preempt: it is PLANNING, or
// RUNNING with a checkpoint directory to resume from (a drain loses no
// step), not already draining, and of strictly lower priority.
struct PreemptionCandidate {
  uint64_t number = 0;  // Job number.
  int priority = 0;
  int workers = 0;  // Of the kind the preempting job needs.
};

// The jobs to drain so that at least `needed` more workers come free, or
// nullopt when all of `candidates` together hold fewer. Lowest priority
// first, and within a priority the jobs holding the most workers first (so
// that the fewest are drained), the newest job first among equal ones
// (older jobs keep their turn); then every chosen job the others cover
// without it is spared, highest priority first. Sorted by job number.
std::optional<std::vector<uint64_t>> ChooseVictims(
    std::vector<PreemptionCandidate> candidates, int needed);

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_SCHEDULING_POLICY_H_
