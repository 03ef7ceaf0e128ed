#include "scheduler/forward_only.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/simulator.h"
#include "scheduler/validator.h"

namespace conveyor::scheduler {
namespace {

using ::testing::HasSubstr;

// Every kind's placement and V, P in 1..16, M in 1..64: the forward-only
// schedule validates under the kind's send model, holds each forward once
// and nothing else, runs the last stage in microbatch order (the order the
// evaluation's loss is summed in) and, at unit cost, is no longer than the
// bound its greedy order guarantees: every rank's M*V forwards plus the
// P*V - 1 ticks the last microbatch needs to cross the pipeline after its
// first forward. With one stage a rank that is exactly M + P - 1, the
// forward pipeline's critical path.
TEST(ForwardOnlyPropertyTest, ValidCompleteAndWithinTheGreedyBound) {
  int generated = 0;
  for (ScheduleKind kind : kAllScheduleKinds) {
    for (int p = 1; p <= 16; ++p) {
      for (int m = 1; m <= 64; ++m) {
        for (int v = 1; v <= 4; ++v) {
          const std::string what =
              std::string(ScheduleKindName(kind)) + " P=" + std::to_string(p) +
              " M=" + std::to_string(m) + " V=" + std::to_string(v);
          auto s = GenerateForwardOnly(
              kind, {.ranks = p, .microbatches = m, .virtual_stages = v});
          const bool supported = PlacementOf(kind) == Placement::kV
                                     ? v == 2
                                     : v == 1 || TakesVirtualStages(kind);
          ASSERT_EQ(s.ok(), supported) << what << ": " << s.status();
          if (!s.ok()) continue;
          ++generated;
          EXPECT_TRUE(s->forward_only);
          EXPECT_EQ(s->placement, PlacementOf(kind));
          ASSERT_TRUE(ValidateSchedule(*s).ok())
              << what << ": " << ValidateSchedule(*s);
          ASSERT_EQ(s->TotalActions(), static_cast<size_t>(p * v * m)) << what;
          const int last = s->num_stages() - 1;
          int next = 0;
          for (const Action& a : s->actions[s->RankOfStage(last)]) {
            ASSERT_EQ(a.op, Op::kForward) << what;
            if (a.stage == last) {
              EXPECT_EQ(a.microbatch, next++) << what;
            }
          }
          auto r = Simulate(*s, SimulationCosts<int64_t>::Uniform(1, 1));
          ASSERT_TRUE(r.ok()) << what << ": " << r.status();
          EXPECT_LE(r->makespan, int64_t{m} * v + int64_t{p} * v - 1) << what;
          if (v == 1) {
            EXPECT_EQ(r->makespan, m + p - 1) << what;
          }
        }
      }
    }
  }
  EXPECT_GT(generated, 10000);
}

// Rank 0 of a V-placed pipeline starts its second chunk of microbatch 0 as
// soon as it arrives, ahead of the rest of its first chunk.
TEST(ForwardOnlyTest, VPlacementTakesTheReturningMicrobatchFirst) {
  auto s =
      GenerateForwardOnly(ScheduleKind::kZeroBubbleV,
                          {.ranks = 2, .microbatches = 6, .virtual_stages = 2});
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<std::string> rank0;
  for (const Action& a : s->actions[0]) rank0.push_back(ToString(a));
  // Stage 3 of microbatch 0 is ready after F0.0, F1.0 (rank 1), F2.0
  // (rank 1): at tick 3, after rank 0's first three forwards.
  EXPECT_THAT(rank0, ::testing::ElementsAre("F0.0", "F0.1", "F0.2", "F3.0",
                                            "F0.3", "F3.1", "F0.4", "F3.2",
                                            "F0.5", "F3.3", "F3.4", "F3.5"));
}

TEST(ForwardOnlyTest, RejectsOptionsWithTheFieldAndTheRule) {
  EXPECT_THAT(
      GenerateForwardOnly(ScheduleKind::k1F1B,
                          {.ranks = 2, .microbatches = 4, .virtual_stages = 2})
          .status()
          .message(),
      HasSubstr("1f1b runs one stage per rank (V = 1), got V = 2"));
  EXPECT_THAT(
      GenerateForwardOnly(ScheduleKind::kZeroBubbleV,
                          {.ranks = 2, .microbatches = 4, .virtual_stages = 1})
          .status()
          .message(),
      HasSubstr("zb-v holds two stages a rank (V = 2, placed in a V)"));
  EXPECT_THAT(
      GenerateForwardOnly(ScheduleKind::k1F1B, {.ranks = 0, .microbatches = 4})
          .status()
          .message(),
      HasSubstr("ranks (stages P) must be in 1.."));
  EXPECT_THAT(GenerateForwardOnly(ScheduleKind::k1F1B,
                                  {.ranks = 4096, .microbatches = 1 << 20})
                  .status()
                  .message(),
              HasSubstr("stage-microbatches is too large"));
}

TEST(ForwardOnlyTest, TheValidatorRefusesABackwardAndAMissingForward) {
  auto s =
      GenerateForwardOnly(ScheduleKind::k1F1B, {.ranks = 2, .microbatches = 2});
  ASSERT_TRUE(s.ok());
  Schedule with_backward = *s;
  with_backward.actions[1].push_back({Op::kBackward, 1, 0});
  EXPECT_THAT(ValidateSchedule(with_backward).message(),
              HasSubstr("is a backward in a forward-only schedule"));
  Schedule missing = *s;
  missing.actions[1].pop_back();
  EXPECT_THAT(ValidateSchedule(missing).message(),
              HasSubstr("F1.1 is missing"));
  // And a training schedule still needs its backwards.
  Schedule training = *s;
  training.forward_only = false;
  EXPECT_THAT(ValidateSchedule(training).message(), HasSubstr("is missing"));
}

}  // namespace
}  // namespace conveyor::scheduler
