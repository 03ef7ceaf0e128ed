#include "worker/drain_gate.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace conveyor::worker {

void DrainGate::Begin(int64_t step) {
  absl::MutexLock lock(&mu_);
  next_boundary_ = step;
}

int64_t DrainGate::RequestStop() {
  absl::MutexLock lock(&mu_);
  requested_ = true;
  return next_boundary_;
}

void DrainGate::StopAfter(int64_t step) {
  absl::MutexLock lock(&mu_);
  requested_ = true;
  if (stop_after_ == 0) stop_after_ = std::max<int64_t>(step, 1);
}

absl::StatusOr<bool> DrainGate::AtBoundary(int64_t done, int64_t last_step,
                                           const Cancellation& cancellation) {
  absl::MutexLock lock(&mu_);
  next_boundary_ = done + 1;
  if (!requested_ || done >= last_step) return false;
  // The cancel comes from another thread without this mutex, so the wait
  // polls it; the decision itself wakes it at once.
  auto decided = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_after_ != 0;
  };
  while (!mu_.AwaitWithTimeout(absl::Condition(&decided),
                               absl::Milliseconds(50))) {
    if (cancellation.cancelled()) return false;
  }
  if (stop_after_ < done) {
    return absl::InternalError(absl::StrCat("drain: told to stop after step ",
                                            stop_after_, " once step ", done,
                                            " was done"));
  }
  if (stop_after_ != done) return false;
  stopped_after_ = done;
  return true;
}

int64_t DrainGate::stopped_after() const {
  absl::MutexLock lock(&mu_);
  return stopped_after_;
}

}  // namespace conveyor::worker
