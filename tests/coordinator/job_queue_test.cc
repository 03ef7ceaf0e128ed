#include "coordinator/job_queue.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

using std::chrono::minutes;
using std::chrono::seconds;
using ::testing::ElementsAre;
using TimePoint = JobQueue::TimePoint;

constexpr int kLow = 0;
constexpr int kNormal = 100;
constexpr int kHigh = 200;
constexpr int kUrgent = 300;

TEST(JobQueueTest, PlacesInSubmissionOrder) {
  JobQueue q;
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.head(), std::nullopt);
  for (uint64_t n : {3, 1, 2}) q.Add(n);
  EXPECT_THAT(q.order(), ElementsAre(3, 1, 2));
  EXPECT_EQ(q.PositionOf(3), 1);
  EXPECT_EQ(q.PositionOf(2), 3);
  EXPECT_EQ(q.PositionOf(9), 0);
  EXPECT_EQ(q.head(), 3u);
  q.PopHead();
  EXPECT_EQ(q.head(), 1u);
  EXPECT_EQ(q.PositionOf(1), 1);
  EXPECT_EQ(q.size(), 2);
}

TEST(JobQueueTest, ARestartedJobGoesFirst) {
  JobQueue q;
  q.Add(5);
  q.Add(6);
  q.AddFirst(2);
  EXPECT_THAT(q.order(), ElementsAre(2, 5, 6));
  // Already queued: moved to the head, never queued twice.
  q.AddFirst(6);
  EXPECT_THAT(q.order(), ElementsAre(6, 2, 5));
  q.Add(2);
  EXPECT_THAT(q.order(), ElementsAre(6, 2, 5));
}

TEST(JobQueueTest, RemovesFromAnywhereAndIgnoresStrangers) {
  JobQueue q;
  for (uint64_t n : {1, 2, 3, 4}) q.Add(n);
  q.Remove(3);
  q.Remove(1);
  q.Remove(42);
  EXPECT_THAT(q.order(), ElementsAre(2, 4));
  EXPECT_EQ(q.PositionOf(4), 2);
  q.PopHead();
  q.PopHead();
  q.PopHead();  // Empty: nothing happens.
  EXPECT_TRUE(q.empty());
}

TEST(JobQueueTest, OrdersByPriorityThenSubmission) {
  JobQueue q(/*aging_per_minute=*/0);
  const TimePoint t0{};
  q.Add(1, kLow, t0);
  q.Add(2, kNormal, t0);
  q.Add(3, kUrgent, t0);
  q.Add(4, kNormal, t0);
  q.Add(5, 150, t0);
  q.Add(6, kHigh, t0);
  EXPECT_THAT(q.order(), ElementsAre(3, 6, 5, 2, 4, 1));
  EXPECT_EQ(q.PositionOf(1), 6);
  EXPECT_EQ(q.EffectivePriority(5), 150);
  // No aging: an hour later, nothing moves.
  q.Reorder(t0 + minutes(60));
  EXPECT_THAT(q.order(), ElementsAre(3, 6, 5, 2, 4, 1));
}

TEST(JobQueueTest, AgingLiftsALongWaitingJobPastNewerHigherOnes) {
  // 2 points a minute: a low job gains a class (100 points) in 50 minutes.
  JobQueue q(/*aging_per_minute=*/2);
  const TimePoint t0{};
  q.Add(1, kLow, t0);
  q.Add(2, kNormal, t0 + minutes(10));
  EXPECT_THAT(q.order(), ElementsAre(2, 1));
  // At 40 min: job 1 waited 40 min (80 points), job 2 30 min (100 + 60).
  q.Reorder(t0 + minutes(40));
  EXPECT_EQ(q.EffectivePriority(1), 80);
  EXPECT_EQ(q.EffectivePriority(2), 160);
  EXPECT_THAT(q.order(), ElementsAre(2, 1));
  // A normal job submitted at 60 min ranks 100; job 1 has 120 by then.
  q.Add(3, kNormal, t0 + minutes(60));
  EXPECT_EQ(q.EffectivePriority(1), 120);
  EXPECT_THAT(q.order(), ElementsAre(2, 1, 3));
  // Aging is floored to whole points: 29.99 s at 2/min is still 0.
  JobQueue fine(/*aging_per_minute=*/2);
  fine.Add(7, kLow, t0);
  fine.Reorder(t0 + seconds(29));
  EXPECT_EQ(fine.EffectivePriority(7), 0);
  fine.Reorder(t0 + seconds(30));
  EXPECT_EQ(fine.EffectivePriority(7), 1);
}

TEST(JobQueueTest, EqualPrioritiesStayFirstComeFirstServedAsTheyAge) {
  JobQueue q(/*aging_per_minute=*/1);
  const TimePoint t0{};
  for (uint64_t n : {4, 2, 9}) q.Add(n, kNormal, t0 + minutes(n));
  q.Reorder(t0 + minutes(500));
  EXPECT_THAT(q.order(), ElementsAre(4, 2, 9));
}

TEST(JobQueueTest, ARestartedJobGoesFirstWithinItsPriorityOnly) {
  JobQueue q(/*aging_per_minute=*/1);
  const TimePoint t0{};
  q.Add(1, kNormal, t0);
  q.Add(2, kHigh, t0);
  // Job 3 (normal) was running; restarted at 30 min, when job 1 has aged
  // 30 points: job 3 ages as long as job 1 and goes before it, but stays
  // behind the high job.
  q.AddFirst(3, kNormal, t0 + minutes(30));
  EXPECT_THAT(q.order(), ElementsAre(2, 3, 1));
  EXPECT_EQ(q.EffectivePriority(3), 130);
  // A low job restarted goes first among low ones, not past normal ones.
  q.Add(4, kLow, t0 + minutes(30));
  q.AddFirst(5, kLow, t0 + minutes(30));
  EXPECT_THAT(q.order(), ElementsAre(2, 3, 1, 5, 4));
}

TEST(JobQueueTest, WaitAccumulatesOverSpellsAndCountsForAging) {
  JobQueue q(/*aging_per_minute=*/1);
  const TimePoint t0{};
  // Restored or requeued with 50 minutes of earlier queued time.
  q.Add(1, kLow, t0, minutes(50));
  q.Add(2, kLow, t0);
  EXPECT_THAT(q.order(), ElementsAre(1, 2));
  EXPECT_EQ(q.EffectivePriority(1), 50);
  EXPECT_EQ(q.Waited(1, t0 + minutes(10)), minutes(60));
  q.Remove(1);
  EXPECT_EQ(q.Waited(1, t0 + minutes(10)), JobQueue::Duration{});
  EXPECT_EQ(q.EffectivePriority(1), 0);
}

TEST(JobQueueTest, AddWithoutATimeTakesTheNewestTimeGiven) {
  JobQueue q(/*aging_per_minute=*/1);
  const TimePoint t0 = TimePoint{} + minutes(1000);
  q.Reorder(t0);
  q.Add(1);  // At t0, not at the epoch: no 1000 minutes of aging.
  EXPECT_EQ(q.EffectivePriority(1), JobQueue::kDefaultPriority);
  q.Reorder(t0 + minutes(5));
  EXPECT_EQ(q.EffectivePriority(1), JobQueue::kDefaultPriority + 5);
}

TEST(JobQueueTest, AJobAddedBeforeAnyTimeStartsWaitingAtTheFirstReorder) {
  JobQueue q(/*aging_per_minute=*/1);
  q.Add(1);
  EXPECT_EQ(q.Waited(1), JobQueue::Duration{});
  const TimePoint t0 = TimePoint{} + minutes(1000);
  q.Reorder(t0);
  EXPECT_EQ(q.EffectivePriority(1), JobQueue::kDefaultPriority);
  q.Reorder(t0 + minutes(3));
  EXPECT_EQ(q.Waited(1), minutes(3));
}

}  // namespace
}  // namespace conveyor::coordinator
