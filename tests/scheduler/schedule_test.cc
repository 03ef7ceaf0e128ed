#include "scheduler/schedule.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/action.h"

namespace conveyor::scheduler {
namespace {

using ::testing::HasSubstr;

TEST(ActionTest, ToStringUsesOpStageDotMicrobatch) {
  EXPECT_EQ(ToString(Action{Op::kForward, 2, 0}), "F2.0");
  EXPECT_EQ(ToString(Action{Op::kBackward, 12, 31}), "B12.31");
  EXPECT_EQ(ToString(Action{Op::kBackwardInput, 3, 7}), "BI3.7");
  EXPECT_EQ(ToString(Action{Op::kBackwardWeight, 0, 1}), "BW0.1");
}

TEST(ActionTest, ParseOpRoundTripsAndRejectsUnknownNames) {
  for (Op op :
       {Op::kForward, Op::kBackward, Op::kBackwardInput, Op::kBackwardWeight}) {
    auto parsed = ParseOp(OpName(op));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, op);
  }
  auto bad = ParseOp("W");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("allowed: F, B, BI, BW"));
}

TEST(ScheduleKindTest, ParseRoundTripsAndListsAllowedNames) {
  for (ScheduleKind kind : kAllScheduleKinds) {
    auto parsed = ParseScheduleKind(ScheduleKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  auto bad = ParseScheduleKind("zb-v");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      bad.status().message(),
      HasSubstr("'zb-v'; allowed: gpipe, 1f1b, interleaved-1f1b, zb-h1"));
}

TEST(ScheduleTest, StagesMapToRanksModuloP) {
  Schedule s;
  s.ranks = 4;
  s.virtual_stages = 2;
  EXPECT_EQ(s.num_stages(), 8);
  EXPECT_EQ(s.RankOfStage(5), 1);
  EXPECT_TRUE(s.IsLastStage(7));
  EXPECT_FALSE(s.IsLastStage(3));
}

}  // namespace
}  // namespace conveyor::scheduler
