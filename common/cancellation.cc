#include "common/cancellation.h"

#include "absl/time/time.h"

namespace conveyor {
namespace {

thread_local const Cancellation* current_cancellation = nullptr;

}  // namespace

void Cancellation::Cancel(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (cancelled_.load(std::memory_order_relaxed)) return;
  status_ = status.ok() ? absl::CancelledError("cancelled") : status;
  cancelled_.store(true, std::memory_order_release);
}

absl::Status Cancellation::status() const {
  if (!cancelled()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status Cancellation::WaitUntil(
    std::chrono::steady_clock::time_point deadline) const {
  // absl::Mutex wakes an Await when the guarded condition may have changed,
  // i.e. when Cancel releases mu_ after setting the flag.
  const absl::Time until =
      absl::Now() +
      absl::FromChrono(deadline - std::chrono::steady_clock::now());
  absl::MutexLock lock(&mu_);
  const auto is_cancelled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_.load(std::memory_order_relaxed);
  };
  mu_.AwaitWithDeadline(absl::Condition(&is_cancelled), until);
  return cancelled_.load(std::memory_order_relaxed) ? status_
                                                    : absl::OkStatus();
}

const Cancellation* CurrentCancellation() { return current_cancellation; }

absl::Status CheckCancelled() {
  const Cancellation* c = current_cancellation;
  if (c == nullptr || !c->cancelled()) return absl::OkStatus();
  return c->status();
}

CancellationScope::CancellationScope(const Cancellation* cancellation)
    : previous_(current_cancellation) {
  current_cancellation = cancellation;
}

CancellationScope::~CancellationScope() { current_cancellation = previous_; }

}  // namespace conveyor
