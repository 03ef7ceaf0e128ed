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
  auto bad = ParseScheduleKind("zb-w");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      bad.status().message(),
      HasSubstr("'zb-w'; allowed: gpipe, 1f1b, interleaved-1f1b, zb-h1"));
  EXPECT_THAT(bad.status().message(), HasSubstr("zb-v, looped-bfs"));
}

TEST(PlacementTest, ParseRoundTripsAndListsAllowedNames) {
  for (Placement p : {Placement::kLoop, Placement::kV}) {
    auto parsed = ParsePlacement(PlacementName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_THAT(ParsePlacement("u").status().message(),
              HasSubstr("'u'; allowed: loop, v"));
}

TEST(PlacementTest, VKeepsTheEndsOnRankZeroAndNeighboursAdjacent) {
  // P = 4, V = 2: rank r holds stages r and 7-r.
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(StagesOfRank(Placement::kV, r, 4, 8),
                ::testing::ElementsAre(r, 7 - r));
  }
  // P = 3, V = 4: down, up, down, up.
  const int want[12] = {0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0};
  for (int s = 0; s < 12; ++s)
    EXPECT_EQ(StageRank(Placement::kV, s, 3), want[s]);
  // Each chunk boundary is local, so a rank talks only to r-1 and r+1.
  EXPECT_THAT(NeighbourRanks(Placement::kV, 0, 4, 8),
              ::testing::ElementsAre(1));
  EXPECT_THAT(NeighbourRanks(Placement::kV, 2, 4, 8),
              ::testing::ElementsAre(1, 3));
  EXPECT_THAT(NeighbourRanks(Placement::kV, 3, 4, 8),
              ::testing::ElementsAre(2));
  // Loop with V > 1 closes the ring: rank P-1 hands chunk 0 to rank 0.
  EXPECT_THAT(NeighbourRanks(Placement::kLoop, 0, 4, 8),
              ::testing::ElementsAre(1, 3));
  EXPECT_THAT(NeighbourRanks(Placement::kLoop, 0, 4, 4),
              ::testing::ElementsAre(1));
  EXPECT_THAT(NeighbourRanks(Placement::kLoop, 0, 1, 3),
              ::testing::ElementsAre());
}

TEST(ScheduleTest, StagesMapToRanksModuloP) {
  Schedule s;
  s.ranks = 4;
  s.virtual_stages = 2;
  EXPECT_EQ(s.num_stages(), 8);
  EXPECT_EQ(s.RankOfStage(5), 1);
  s.placement = Placement::kV;
  EXPECT_EQ(s.RankOfStage(5), 2);
  EXPECT_EQ(s.RankOfStage(7), 0);
  EXPECT_TRUE(s.IsLastStage(7));
  EXPECT_FALSE(s.IsLastStage(3));
}

}  // namespace
}  // namespace conveyor::scheduler
