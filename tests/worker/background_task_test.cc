#include "worker/background_task.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace conveyor::worker {
namespace {

TEST(BackgroundTaskTest, RunsOffTheCallingThreadAndWaitReturnsItsStatus) {
  BackgroundTask task;
  EXPECT_FALSE(task.in_flight());
  EXPECT_TRUE(task.Wait().ok());  // Nothing in flight.

  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  absl::Notification release;
  absl::StatusOr<double> waited = task.Start([&] {
    ran_on = std::this_thread::get_id();
    release.WaitForNotification();
    return absl::OkStatus();
  });
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_GE(*waited, 0.0);
  // Start returned while the task is still blocked.
  EXPECT_TRUE(task.in_flight());
  release.Notify();
  EXPECT_TRUE(task.Wait().ok());
  EXPECT_FALSE(task.in_flight());
  EXPECT_NE(ran_on, caller);
}

TEST(BackgroundTaskTest, AtMostOneInFlightAndAnErrorIsReportedOnce) {
  BackgroundTask task;
  std::atomic<int> running{0}, most{0};
  auto body = [&](absl::Status result) {
    return [&, result] {
      const int now = ++running;
      most = std::max(most.load(), now);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      --running;
      return result;
    };
  };
  ASSERT_TRUE(task.Start(body(absl::OkStatus())).ok());
  // Waits for the first (about 20 ms) before starting the second.
  absl::StatusOr<double> waited = task.Start(body(absl::DataLossError("disk")));
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_GT(*waited, 0.0);
  // The failed task's error comes back from the next Start, which then
  // starts nothing.
  bool started = false;
  absl::StatusOr<double> refused = task.Start([&] {
    started = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(task.in_flight());
  EXPECT_FALSE(started);
  EXPECT_EQ(most.load(), 1);
  // Once only.
  EXPECT_TRUE(task.Wait().ok());
}

TEST(BackgroundTaskTest, TheDestructorWaitsForTheTaskInFlight) {
  std::atomic<bool> finished{false};
  {
    BackgroundTask task;
    ASSERT_TRUE(task.Start([&] {
                      std::this_thread::sleep_for(
                          std::chrono::milliseconds(20));
                      finished = true;
                      return absl::OkStatus();
                    })
                    .ok());
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace conveyor::worker
