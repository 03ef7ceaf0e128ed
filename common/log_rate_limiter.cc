#include "common/log_rate_limiter.h"

#include <algorithm>

namespace conveyor {

LogRateLimiter::LogRateLimiter(int burst, Clock::duration period)
    : burst_(std::max(burst, 1)), period_(period) {}

bool LogRateLimiter::Allow(Clock::time_point now, uint64_t* suppressed) {
  absl::MutexLock lock(&mu_);
  if (!started_ || now - window_start_ >= period_) {
    started_ = true;
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace conveyor
