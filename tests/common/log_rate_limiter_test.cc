// LogRateLimiter: `burst` lines per window, the rest counted and reported
// with the next line written. Time is passed in: no test waits.
#include "common/log_rate_limiter.h"

#include <chrono>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

using std::chrono::seconds;
using Clock = LogRateLimiter::Clock;

TEST(LogRateLimiterTest, BurstPerWindowThenTheCountOfWhatWasLeftOut) {
  LogRateLimiter limiter(3, seconds(10));
  const Clock::time_point t0 = Clock::time_point() + seconds(100);
  uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter.Allow(t0 + seconds(i), &suppressed)) << i;
    EXPECT_EQ(suppressed, 0u);
  }
  // A flood within the window: nothing more is written.
  for (int i = 0; i < 4000; ++i) {
    EXPECT_FALSE(limiter.Allow(t0 + seconds(5), &suppressed));
  }
  // The next window's first line tells how many were left out.
  EXPECT_TRUE(limiter.Allow(t0 + seconds(10), &suppressed));
  EXPECT_EQ(suppressed, 4000u);
  EXPECT_TRUE(limiter.Allow(t0 + seconds(11), &suppressed));
  EXPECT_EQ(suppressed, 0u);
}

TEST(LogRateLimiterTest, ABurstBelowOneStillWritesOneLine) {
  LogRateLimiter limiter(0, seconds(1));
  uint64_t suppressed = 0;
  const Clock::time_point t0 = Clock::time_point() + seconds(1);
  EXPECT_TRUE(limiter.Allow(t0, &suppressed));
  EXPECT_FALSE(limiter.Allow(t0, &suppressed));
}

}  // namespace
}  // namespace conveyor
