#include "coordinator/attempt_ranks.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;

v1::JobReady Ready(const std::string& endpoint) {
  v1::JobReady r;
  r.set_data_endpoint(endpoint);
  return r;
}

TEST(AttemptRanksTest, AllReadyOnceEveryRankReportedOnce) {
  AttemptRanks a;
  a.Start(3);
  EXPECT_FALSE(a.all_ready());
  EXPECT_TRUE(a.MarkReady(2, Ready("h:3")));
  EXPECT_TRUE(a.MarkReady(0, Ready("h:1")));
  // A duplicate does not count twice nor replace the first report.
  EXPECT_FALSE(a.MarkReady(0, Ready("h:9")));
  EXPECT_FALSE(a.all_ready());
  EXPECT_FALSE(a.is_ready(1));
  EXPECT_TRUE(a.MarkReady(1, Ready("h:2")));
  EXPECT_TRUE(a.all_ready());
  EXPECT_THAT(a.endpoints(), ElementsAre("h:1", "h:2", "h:3"));
  EXPECT_EQ(a.ready_reports()[0].data_endpoint(), "h:1");
}

TEST(AttemptRanksTest, RanksOutOfRangeAreIgnored) {
  AttemptRanks a;
  a.Start(2);
  EXPECT_FALSE(a.MarkReady(-1, Ready("x")));
  EXPECT_FALSE(a.MarkReady(2, Ready("x")));
  a.MarkEnded(5);
  a.MarkEnded(-1);
  EXPECT_FALSE(a.is_ready(7));
  EXPECT_FALSE(a.ended(7));
  EXPECT_FALSE(a.all_ended());
}

TEST(AttemptRanksTest, AllEndedOnceEveryRankEnded) {
  AttemptRanks a;
  a.Start(2);
  a.MarkEnded(1);
  EXPECT_TRUE(a.ended(1));
  EXPECT_FALSE(a.all_ended());
  a.MarkEnded(0);
  EXPECT_TRUE(a.all_ended());
}

TEST(AttemptRanksTest, ARestoredJobHasEndedEverywhereAndClearForgets) {
  AttemptRanks a;
  a.StartEnded(3);
  EXPECT_TRUE(a.all_ended());
  EXPECT_FALSE(a.all_ready());
  a.Clear();
  EXPECT_EQ(a.size(), 0);
  a.Start(1);
  EXPECT_FALSE(a.ended(0));
  EXPECT_TRUE(a.MarkReady(0, Ready("h:1")));
  EXPECT_TRUE(a.all_ready());
}

}  // namespace
}  // namespace conveyor::coordinator
