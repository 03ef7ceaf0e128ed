// LogRateLimiter: at most `burst` log lines per `period` for one kind of
// event that outsiders can trigger at will (a flood of bad connections once
// wrote 4,011 warnings in seconds), and a count of the lines left out, told
// with the next line that is written. Thread-safe.
#ifndef CONVEYOR_COMMON_LOG_RATE_LIMITER_H_
#define CONVEYOR_COMMON_LOG_RATE_LIMITER_H_

#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace conveyor {

class LogRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  // burst >= 1 lines in every window of `period`, windows starting at the
  // first event after the previous one ended.
  LogRateLimiter(int burst, Clock::duration period);

  // Whether the event at `now` is logged. When it is, `*suppressed` is set
  // to the number of events not logged since the last one that was (to
  // append "and N more like it" to the line).
  bool Allow(Clock::time_point now, uint64_t* suppressed)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool Allow(uint64_t* suppressed) { return Allow(Clock::now(), suppressed); }

 private:
  const int burst_;
  const Clock::duration period_;
  absl::Mutex mu_;
  Clock::time_point window_start_ ABSL_GUARDED_BY(mu_);
  int in_window_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_LOG_RATE_LIMITER_H_
