// The ids the coordinator gives out: "job-<n>" and "worker-<n>", numbered
// from 1 in submission and registration order. Thread-safe (pure functions).
#ifndef CONVEYOR_COORDINATOR_IDS_H_
#define CONVEYOR_COORDINATOR_IDS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace conveyor::coordinator {

std::string JobId(uint64_t number);
std::string WorkerId(int64_t number);

// The number in an id, or 0 when `id` is not of that form (0 is never
// given out).
uint64_t JobNumber(absl::string_view id);
int64_t WorkerNumber(absl::string_view id);

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_IDS_H_
