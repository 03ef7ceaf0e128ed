#include "scheduler/simulator.h"

#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/generators.h"

namespace conveyor::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Schedule Make(ScheduleKind kind, int p, int m, int v = 1) {
  auto s = GenerateSchedule(
      kind, {.ranks = p, .microbatches = m, .virtual_stages = v});
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(SimulatorTest, OneFOneBTimelineByHand) {
  // P=2, M=2, F=1, B=2: rank 0: F0.0[0,1] F0.1[1,2] B0.0[4,6] B0.1[7,9];
  // rank 1: F1.0[1,2] B1.0[2,4] F1.1[4,5] B1.1[5,7].
  auto r = Simulate(Make(ScheduleKind::k1F1B, 2, 2),
                    SimulationCosts<int64_t>::Uniform(1, 2));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->makespan, 9);
  EXPECT_THAT(r->busy, ElementsAre(6, 6));
  EXPECT_THAT(r->idle, ElementsAre(3, 3));
  EXPECT_EQ(r->timings[0][2].start, 4);
  EXPECT_EQ(r->timings[0][3].start, 7);
  EXPECT_EQ(r->timings[1][2].start, 4);
  EXPECT_EQ(r->timings[1][3].end, 7);
  EXPECT_THAT(r->peak_inflight, ElementsAre(2, 1));
  EXPECT_DOUBLE_EQ(r->bubble_fraction(), 6.0 / 18.0);
}

TEST(SimulatorTest, CommunicationAddsLatencyPlusBytesOverBandwidth) {
  auto costs = SimulationCosts<int64_t>::Uniform(1, 2);
  costs.latency = 1;
  costs.bytes_per_time = 4;
  costs.activation_bytes = {8};  // 1 + 8/4 = 3 per hop.
  auto r = Simulate(Make(ScheduleKind::kGPipe, 2, 1), costs);
  ASSERT_TRUE(r.ok());
  // F0.0 [0,1], hop 3, F1.0 [4,5], B1.0 [5,7], hop 3, B0.0 [10,12].
  EXPECT_EQ(r->makespan, 12);
  EXPECT_EQ(r->timings[1][0].start, 4);
  EXPECT_EQ(r->timings[0][1].start, 10);
}

TEST(SimulatorTest, DoubleCostsAndPerStageVectors) {
  SimulationCosts<double> costs;
  costs.forward = {0.5, 1.5};
  costs.backward = {1.0, 3.0};
  auto r = Simulate(Make(ScheduleKind::kGPipe, 2, 1), costs);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->makespan, 0.5 + 1.5 + 3.0 + 1.0);
}

TEST(SimulatorTest, SplitBackwardTracksPendingWeightGradients) {
  auto r = Simulate(Make(ScheduleKind::kZeroBubbleH1, 4, 8),
                    SimulationCosts<int64_t>::UniformSplit(1, 1, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->peak_pending_weight_grads, ElementsAre(1, 2, 3, 4));
  // Stash until BW: 1F1B's P-r plus the r held-back weight gradients.
  EXPECT_THAT(r->peak_inflight, ElementsAre(4, 4, 4, 4));
}

TEST(SimulatorTest, BackwardInputAloneDoesNotNeedBackwardWeight) {
  // A full-backward schedule with only backward_input given (and backward
  // set) must not read the empty backward_weight.
  auto costs = SimulationCosts<int64_t>::Uniform(1, 2);
  costs.backward_input = {1};
  auto r = Simulate(Make(ScheduleKind::k1F1B, 2, 2), costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->makespan, 9);
}

TEST(SimulatorTest, RejectsBadCosts) {
  Schedule s = Make(ScheduleKind::k1F1B, 2, 2);
  SimulationCosts<int64_t> empty;
  EXPECT_THAT(Simulate(s, empty).status().message(),
              HasSubstr("'forward' is needed"));
  auto wrong_len = SimulationCosts<int64_t>::Uniform(1, 2);
  wrong_len.forward = {1, 2, 3};
  EXPECT_THAT(Simulate(s, wrong_len).status().message(),
              HasSubstr("'forward' has 3 entries; expected 1 or 2"));
  auto negative = SimulationCosts<int64_t>::Uniform(1, -2);
  EXPECT_THAT(Simulate(s, negative).status().message(),
              HasSubstr("finite and >= 0"));
  EXPECT_THAT(Simulate(Make(ScheduleKind::kZeroBubbleH1, 2, 2),
                       SimulationCosts<int64_t>::Uniform(1, 2))
                  .status()
                  .message(),
              HasSubstr("'backward_input' is needed"));
  auto inexact = SimulationCosts<int64_t>::Uniform(1, 2);
  inexact.bytes_per_time = 3;
  inexact.activation_bytes = {8};
  EXPECT_THAT(Simulate(s, inexact).status().message(),
              HasSubstr("must be a multiple of bytes_per_time"));
}

TEST(SimulatorTest, IntegerTimeThatWouldOverflowIsAnErrorNotUB) {
  Schedule s = Make(ScheduleKind::k1F1B, 2, 2);
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  auto r = Simulate(s, SimulationCosts<int64_t>::Uniform(kHuge, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("overflows 64-bit integer"));
  auto split = Simulate(Make(ScheduleKind::kZeroBubbleH1, 2, 2),
                        SimulationCosts<int64_t>::UniformSplit(1, kHuge, 1));
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  auto comm = SimulationCosts<int64_t>::Uniform(1, 2);
  comm.latency = kHuge;
  comm.bytes_per_time = 1;
  comm.activation_bytes = {1};
  EXPECT_THAT(Simulate(s, comm).status().message(), HasSubstr("too large"));
  // Large but representable totals still simulate exactly.
  auto big = Simulate(
      s, SimulationCosts<int64_t>::Uniform(int64_t{1} << 40, int64_t{1} << 41));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->makespan, 3 * (int64_t{3} << 40));
}

TEST(SimulatorTest, RejectsAbsurdDeclaredSizesBeforeAllocating) {
  Schedule s = Make(ScheduleKind::k1F1B, 2, 2);
  s.microbatches = 1 << 30;
  auto r = Simulate(s, SimulationCosts<int64_t>::Uniform(1, 2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("too large to simulate"));
}

TEST(SimulatorTest, StuckScheduleIsFailedPreconditionNotAHang) {
  Schedule s = Make(ScheduleKind::k1F1B, 2, 1);
  std::swap(s.actions[1][0], s.actions[1][1]);  // B1.0 before F1.0.
  auto r = Simulate(s, SimulationCosts<int64_t>::Uniform(1, 2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("can never start action"));
}

}  // namespace
}  // namespace conveyor::scheduler
