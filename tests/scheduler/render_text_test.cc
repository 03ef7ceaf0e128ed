#include "scheduler/render_text.h"

#include <algorithm>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/generators.h"

namespace conveyor::scheduler {
namespace {

using ::testing::HasSubstr;

Schedule Generate(ScheduleKind kind, int ranks, int microbatches,
                  int virtual_stages = 1) {
  absl::StatusOr<Schedule> schedule =
      GenerateSchedule(kind, {.ranks = ranks,
                              .microbatches = microbatches,
                              .virtual_stages = virtual_stages});
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return schedule.ok() ? *std::move(schedule) : Schedule{};
}

TEST(RenderTextTest, OneFOneBFourByFourIsTheTextbookPicture) {
  // Rank r warms up with P-r-1 forwards, alternates, then drains.
  EXPECT_EQ(RenderText(Generate(ScheduleKind::k1F1B, 4, 4)),
            "rank 0: F0.0 F0.1 F0.2 F0.3 B0.0 B0.1 B0.2 B0.3\n"
            "rank 1: F1.0 F1.1 F1.2 B1.0 F1.3 B1.1 B1.2 B1.3\n"
            "rank 2: F2.0 F2.1 B2.0 F2.2 B2.1 F2.3 B2.2 B2.3\n"
            "rank 3: F3.0 B3.0 F3.1 B3.1 F3.2 B3.2 F3.3 B3.3\n");
}

TEST(RenderTextTest, InterleavedWithOneChunkMatchesTheIssueExample) {
  const std::string text =
      RenderText(Generate(ScheduleKind::kInterleaved1F1B, 4, 4));
  EXPECT_THAT(text,
              HasSubstr("\nrank 2: F2.0 F2.1 F2.2 B2.0 F2.3 B2.1 B2.2 B2.3\n"));
}

TEST(RenderTextTest, VirtualStagesShowTheirStageNumbers) {
  // P=2, V=2: rank 0 holds stages 0 and 2, rank 1 holds 1 and 3.
  Schedule s;
  s.kind = ScheduleKind::kGPipe;
  s.ranks = 2;
  s.virtual_stages = 2;
  s.actions = {{{Op::kForward, 0, 0},
                {Op::kForward, 2, 0},
                {Op::kBackward, 2, 0},
                {Op::kBackward, 0, 0}},
               {{Op::kForward, 1, 0},
                {Op::kForward, 3, 0},
                {Op::kBackward, 3, 0},
                {Op::kBackward, 1, 0}}};
  EXPECT_EQ(RenderText(s),
            "rank 0: F0.0 F2.0 B2.0 B0.0\n"
            "rank 1: F1.0 F3.0 B3.0 B1.0\n");
}

TEST(RenderTextTest, SplitBackwardOpsAndEmptyRanks) {
  Schedule s;
  s.kind = ScheduleKind::kZeroBubbleH1;
  s.ranks = 3;
  s.microbatches = 11;
  s.actions = {{{Op::kForward, 0, 10},
                {Op::kBackwardInput, 0, 10},
                {Op::kBackwardWeight, 0, 10}},
               {},
               {{Op::kBackward, 2, 3}}};
  EXPECT_EQ(RenderText(s),
            "rank 0: F0.10 BI0.10 BW0.10\n"
            "rank 1:\n"
            "rank 2: B2.3\n");
}

TEST(RenderTextTest, RankNumbersAreNotPadded) {
  const std::string text = RenderText(Generate(ScheduleKind::kGPipe, 12, 1));
  EXPECT_THAT(text, HasSubstr("\nrank 2: F2.0 B2.0\n"));
  EXPECT_THAT(text, HasSubstr("\nrank 11: F11.0 B11.0\n"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 12);
}

TEST(RenderTextTest, NoRanksRendersNothing) {
  Schedule s;
  s.actions.clear();
  EXPECT_EQ(RenderText(s), "");
}

}  // namespace
}  // namespace conveyor::scheduler
