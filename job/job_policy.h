// A job's scheduling policy fields (`priority:` and `owner:` in the job
// file; docs/jobs.md "Priority and owner"): the priority classes and their
// numbers, and what an owner name may hold. The coordinator's queue, quotas
// and preemption (coordinator/job_queue.h, placer.h) order and limit jobs by
// them; they do not change what a job trains, so they are outside its
// configuration hash (job/config_scope.h).
//
// Thread-safe (constants and pure functions).
#ifndef CONVEYOR_JOB_JOB_POLICY_H_
#define CONVEYOR_JOB_JOB_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace conveyor::job {

// The classes, 100 apart so that an integer priority can sit between two
// (150: above every normal job, below every high one) and aging
// (coordinator --aging-per-minute) moves a job up one class per 100 points.
inline constexpr int kPriorityLow = 0;
inline constexpr int kPriorityNormal = 100;
inline constexpr int kPriorityHigh = 200;
inline constexpr int kPriorityUrgent = 300;
// An integer `priority:` lies in [kMinPriority, kMaxPriority].
inline constexpr int kMinPriority = 0;
inline constexpr int kMaxPriority = 1000;

// Class names in the order of their numbers.
inline constexpr absl::string_view kPriorityClasses[] = {"low", "normal",
                                                         "high", "urgent"};

// The number of a class name ("high" -> 200); nullopt for another text.
std::optional<int> PriorityOfClass(absl::string_view name);

// "high" for 200, the number itself for one between classes ("150").
std::string PriorityName(int priority);

// An owner (a team, a user) names whose quota of workers a job counts
// against: 1 to kMaxOwnerBytes of [A-Za-z0-9._-], so that it fits a
// `--owner-quota=team-a=16,...` flag, a metric label and a table column.
inline constexpr size_t kMaxOwnerBytes = 64;
inline constexpr absl::string_view kOwnerCharacters = "A-Z a-z 0-9 . _ -";
bool IsValidOwner(absl::string_view owner);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_JOB_POLICY_H_
