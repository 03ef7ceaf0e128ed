#include "coordinator/job_queue.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;

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

}  // namespace
}  // namespace conveyor::coordinator
