// Cancellation: the first status wins, a wait ends at its deadline or at the
// cancel, and the thread's scope nests and ends.
#include "common/cancellation.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST(CancellationTest, TheFirstStatusWins) {
  Cancellation c;
  EXPECT_FALSE(c.cancelled());
  EXPECT_TRUE(c.status().ok());
  c.Cancel(absl::CancelledError("user asked"));
  c.Cancel(absl::DeadlineExceededError("later"));
  EXPECT_TRUE(c.cancelled());
  EXPECT_EQ(c.status(), absl::CancelledError("user asked"));
}

TEST(CancellationTest, AnOkStatusBecomesCancelled) {
  Cancellation c;
  c.Cancel(absl::OkStatus());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled);
}

TEST(CancellationTest, WaitUntilEndsAtTheDeadlineWhenNotCancelled) {
  Cancellation c;
  const Clock::time_point deadline = Clock::now() + milliseconds(30);
  EXPECT_TRUE(c.WaitUntil(deadline).ok());
  EXPECT_GE(Clock::now(), deadline);
  // A deadline in the past returns at once, OK.
  EXPECT_TRUE(c.WaitUntil(Clock::now() - milliseconds(5)).ok());
}

TEST(CancellationTest, WaitUntilEndsAtTheCancel) {
  Cancellation c;
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(50));
    c.Cancel(absl::CancelledError("stop"));
  });
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(c.WaitUntil(start + std::chrono::hours(1)),
            absl::CancelledError("stop"));
  canceller.join();
  // A liveness bound: the wait was for an hour.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  // Cancelled already: no wait at all.
  EXPECT_EQ(c.WaitUntil(Clock::now() + std::chrono::hours(1)).code(),
            absl::StatusCode::kCancelled);
}

TEST(CancellationTest, ScopesNestAndEnd) {
  EXPECT_EQ(CurrentCancellation(), nullptr);
  EXPECT_TRUE(CheckCancelled().ok());
  Cancellation outer, inner;
  inner.Cancel(absl::CancelledError("inner"));
  {
    CancellationScope a(&outer);
    EXPECT_EQ(CurrentCancellation(), &outer);
    EXPECT_TRUE(CheckCancelled().ok());
    {
      CancellationScope b(&inner);
      EXPECT_EQ(CheckCancelled(), absl::CancelledError("inner"));
    }
    EXPECT_EQ(CurrentCancellation(), &outer);
    // Another thread does not see this thread's scope.
    std::thread([] { EXPECT_EQ(CurrentCancellation(), nullptr); }).join();
  }
  EXPECT_EQ(CurrentCancellation(), nullptr);
}

}  // namespace
}  // namespace conveyor
