#include "scheduler/validator.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/generators.h"
#include "scheduler/simulator.h"

namespace conveyor::scheduler {
namespace {

using ::testing::HasSubstr;

// Builds a schedule from lines like "F0.0 F0.1 B0.1 B0.0", one per rank.
Schedule Parse(int ranks, int microbatches, std::vector<std::string> lines,
               int virtual_stages = 1) {
  Schedule s;
  s.ranks = ranks;
  s.microbatches = microbatches;
  s.virtual_stages = virtual_stages;
  for (const std::string& line : lines) {
    auto& program = s.actions.emplace_back();
    for (absl::string_view token :
         absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      const size_t digits = token.find_first_of("0123456789");
      const size_t dot = token.find('.');
      Action a;
      a.op = *ParseOp(token.substr(0, digits));
      a.stage = std::stoi(std::string(token.substr(digits, dot - digits)));
      a.microbatch = std::stoi(std::string(token.substr(dot + 1)));
      program.push_back(a);
    }
  }
  return s;
}

ScheduleViolation MustViolate(const Schedule& s) {
  auto v = FindViolation(s);
  EXPECT_TRUE(v.has_value()) << "expected a violation";
  return v.value_or(ScheduleViolation{});
}

TEST(ValidatorTest, AcceptsHandWritten1F1B) {
  EXPECT_TRUE(ValidateSchedule(
                  Parse(2, 2, {"F0.0 F0.1 B0.0 B0.1", "F1.0 B1.0 F1.1 B1.1"}))
                  .ok());
}

TEST(ValidatorTest, BackwardBeforeItsForwardNamesRankActionAndReason) {
  Schedule s = Parse(2, 2, {"F0.0 F0.1 B0.0 B0.1", "B1.0 F1.0 F1.1 B1.1"});
  ScheduleViolation v = MustViolate(s);
  EXPECT_EQ(v.rank, 1);
  EXPECT_EQ(v.index, 0);
  EXPECT_EQ(ToString(v.action), "B1.0");
  EXPECT_THAT(v.reason, HasSubstr("runs before its forward F1.0"));
  EXPECT_THAT(ValidateSchedule(s).message(),
              HasSubstr("rank 1, action #0 (B1.0): runs before its forward"));
}

TEST(ValidatorTest, SendReceiveCycleDeadlocksUnderRendezvous) {
  // Rank 0 waits for B1.0's gradient before sending F0.1's activation; rank 1
  // wants F1.1's input before running B1.0. Each waits on the other.
  Schedule s = Parse(2, 2, {"F0.0 B0.0 F0.1 B0.1", "F1.0 F1.1 B1.0 B1.1"});
  ScheduleViolation v = MustViolate(s);
  EXPECT_EQ(v.rank, 0);
  EXPECT_EQ(ToString(v.action), "B0.0");
  EXPECT_THAT(v.reason, HasSubstr("deadlocks under rendezvous sends"));
  EXPECT_THAT(v.reason,
              HasSubstr("rank 0 waits to receive a gradient from rank 1"));
  EXPECT_THAT(v.reason,
              HasSubstr("rank 1 waits to receive an activation from rank 0"));
}

TEST(ValidatorTest, OutOfOrderReceiveIsAMessageMismatch) {
  // Tag-matched transports would run this, but rank 0 sends mb 0 first and
  // rank 1 consumes mb 1 first: over NCCL, F1.1 would get mb 0's activation.
  Schedule s = Parse(2, 2, {"F0.0 F0.1 B0.0 B0.1", "F1.1 F1.0 B1.0 B1.1"});
  ScheduleViolation v = MustViolate(s);
  EXPECT_EQ(v.rank, 1);
  EXPECT_THAT(v.reason, HasSubstr("in-order transports (NCCL)"));
}

TEST(ValidatorTest, ReportsDuplicatesWrongRankRangesAndMixing) {
  EXPECT_THAT(MustViolate(Parse(1, 1, {"F0.0 F0.0 B0.0"})).reason,
              HasSubstr("appears more than once"));
  EXPECT_THAT(MustViolate(Parse(2, 1, {"F1.0 B1.0", "F0.0 B0.0"})).reason,
              HasSubstr("stage 1 lives on rank 1, not rank 0"));
  EXPECT_THAT(MustViolate(Parse(1, 1, {"F0.3 B0.3"})).reason,
              HasSubstr("microbatch 3 is out of range (0..0)"));
  EXPECT_THAT(MustViolate(Parse(1, 1, {"F2.0 B2.0"})).reason,
              HasSubstr("stage 2 is out of range"));
  EXPECT_THAT(MustViolate(Parse(1, 1, {"F0.0 BI0.0 B0.0"})).reason,
              HasSubstr("mixes a full backward"));
  EXPECT_THAT(MustViolate(Parse(1, 1, {"F0.0 BW0.0 BI0.0"})).reason,
              HasSubstr("runs before BI0.0"));
}

TEST(ValidatorTest, LocalOrderAcrossVirtualStagesOnOneRank) {
  // P = 1, V = 2: both stages on rank 0; F1.0 needs F0.0 first, B0.0 needs
  // B1.0 first.
  EXPECT_THAT(MustViolate(Parse(1, 1, {"F1.0 F0.0 B1.0 B0.0"}, 2)).reason,
              HasSubstr("runs before F0.0, which produces its input"));
  EXPECT_THAT(MustViolate(Parse(1, 1, {"F0.0 F1.0 B0.0 B1.0"}, 2)).reason,
              HasSubstr("runs before the backward of stage 1 mb 0"));
  EXPECT_TRUE(ValidateSchedule(Parse(1, 1, {"F0.0 F1.0 B1.0 B0.0"}, 2)).ok());
}

TEST(ValidatorTest, ReportsMissingActions) {
  ScheduleViolation v = MustViolate(Parse(2, 1, {"F0.0 B0.0", "F1.0"}));
  EXPECT_EQ(v.rank, 1);
  EXPECT_EQ(v.index, -1);
  EXPECT_EQ(ToString(v), "rank 1: B1.0 is missing (or BI and BW)");
  EXPECT_THAT(MustViolate(Parse(1, 1, {"F0.0 BI0.0"})).reason,
              HasSubstr("is missing (its BI is present)"));
}

TEST(ValidatorTest, ReportsShapeErrors) {
  Schedule s = Parse(2, 1, {"F0.0 B0.0"});
  EXPECT_THAT(MustViolate(s).reason,
              HasSubstr("schedule lists 1 ranks but declares 2"));
  s.microbatches = 0;
  EXPECT_THAT(MustViolate(s).reason, HasSubstr("microbatches must be >= 1"));
  // Declared sizes are checked before anything is allocated per
  // (stage, microbatch).
  s.microbatches = 1 << 30;
  EXPECT_THAT(MustViolate(s).reason, HasSubstr("is too large"));
}

TEST(ValidatorTest, ReversedGradientOrderIsCaughtBetweenNeighbours) {
  // Rank 1 sends gradients for mb 1 then mb 0; rank 0 expects mb 0 first.
  Schedule s = Parse(2, 2, {"F0.0 F0.1 B0.0 B0.1", "F1.0 F1.1 B1.1 B1.0"});
  ScheduleViolation v = MustViolate(s);
  EXPECT_EQ(v.rank, 0);
  EXPECT_EQ(ToString(v.action), "B0.0");
  EXPECT_THAT(v.reason, HasSubstr("sends the gradient of stage 1 mb 1"));
}

TEST(ValidatorTest, ReportsTheFirstMismatchingReceiveWithItsPosition) {
  // Three ranks, two mismatched channels: rank 1 receives activations from
  // rank 0 in the order mb 0, 2, 1 (its position 1 mismatches), and rank 2
  // receives mb 1 before mb 0 from rank 1 (position 0). Rank 1's receive
  // comes first by rank, so it is the one reported, with the position on its
  // channel and the message actually sent there.
  Schedule s =
      Parse(3, 3,
            {"F0.0 F0.1 F0.2 B0.0 B0.1 B0.2", "F1.0 F1.2 F1.1 B1.0 B1.1 B1.2",
             "F2.1 F2.0 F2.2 B2.0 B2.1 B2.2"});
  ScheduleViolation v = MustViolate(s);
  EXPECT_EQ(v.rank, 1);
  EXPECT_EQ(v.index, 1);
  EXPECT_EQ(v.reason,
            "its input is message #1 from rank 0, expected to be the "
            "activation of stage 0 mb 2 (stage 0 -> 1), but rank 0 sends the "
            "activation of stage 0 mb 1 (stage 0 -> 1) at that position; "
            "in-order transports (NCCL) would deliver the wrong tensor");
}

TEST(ValidatorTest, TwoRanksKeepActivationsAndGradientsOnSeparateStreams) {
  // With P = 2 both directions connect the same two ranks. Rank 1 sends
  // act(1,0), grad(3,0), act(1,1), ...; rank 0 consumes act(1,0), act(1,1),
  // grad(3,0), ... On one shared in-order channel that would be a mismatch;
  // on separate activation and gradient streams (the executor model) each
  // stream is in order.
  Schedule s = Parse(2, 2,
                     {"F0.0 F2.0 F0.1 F2.1 B2.0 B2.1 B0.0 B0.1",
                      "F1.0 F3.0 B3.0 F1.1 F3.1 B3.1 B1.0 B1.1"},
                     2);
  EXPECT_TRUE(ValidateSchedule(s).ok()) << ValidateSchedule(s);
  auto generated =
      GenerateSchedule(ScheduleKind::kInterleaved1F1B,
                       {.ranks = 2, .microbatches = 4, .virtual_stages = 2});
  ASSERT_TRUE(generated.ok());
  EXPECT_TRUE(ValidateSchedule(*generated).ok())
      << ValidateSchedule(*generated);
}

TEST(ValidatorTest, RingOfBlockedSendsIsADeadlockOnlyUnderRendezvous) {
  // Breadth-first GPipe with V = 2: every microbatch goes through chunk 0
  // before any enters chunk 1. With asynchronous sends it runs (the simulator
  // completes it), but with rendezvous sends rank 1's chunk-0 output waits
  // for rank 0 to start chunk 1, and rank 0 is still waiting to hand chunk-0
  // work to rank 1: a ring of blocked activation sends.
  Schedule s = Parse(2, 4,
                     {"F0.0 F0.1 F0.2 F0.3 F2.0 F2.1 F2.2 F2.3 "
                      "B2.3 B2.2 B2.1 B2.0 B0.3 B0.2 B0.1 B0.0",
                      "F1.0 F1.1 F1.2 F1.3 F3.0 F3.1 F3.2 F3.3 "
                      "B3.3 B3.2 B3.1 B3.0 B1.3 B1.2 B1.1 B1.0"},
                     2);
  EXPECT_TRUE(Simulate(s, SimulationCosts<int64_t>::Uniform(1, 2)).ok());
  ScheduleViolation v = MustViolate(s);
  EXPECT_THAT(v.reason, HasSubstr("deadlocks under rendezvous sends"));
  EXPECT_THAT(v.reason, HasSubstr("waits to send an activation to rank 1"));
  EXPECT_THAT(v.reason, HasSubstr("waits to send an activation to rank 0"));
  // The generator visits chunks in groups of P instead, which validates.
  auto generated =
      GenerateSchedule(ScheduleKind::kGPipe,
                       {.ranks = 2, .microbatches = 4, .virtual_stages = 2});
  ASSERT_TRUE(generated.ok());
  EXPECT_TRUE(ValidateSchedule(*generated).ok())
      << ValidateSchedule(*generated);
}

TEST(ValidatorTest, TheSameRingRunsWithBufferedSends) {
  // zb-v's model: a send never waits, so only a true cycle deadlocks. The
  // ring above is then fine (rank 1 is placed v-wise here: stages 1 and 2).
  Schedule s = Parse(2, 2,
                     {"F0.0 F0.1 F3.0 F3.1 B3.0 B3.1 B0.0 B0.1",
                      "F1.0 F1.1 F2.0 F2.1 B2.0 B2.1 B1.0 B1.1"},
                     2);
  s.kind = ScheduleKind::kZeroBubbleV;
  s.placement = Placement::kV;
  EXPECT_TRUE(ValidateSchedule(s).ok()) << ValidateSchedule(s);
  // Rank 0 wants F3.0's input before it sends F0.1, while rank 1 runs F2.0
  // only after F1.1, which needs F0.1: a cycle no buffering breaks.
  Schedule cycle = Parse(2, 2,
                         {"F0.0 F3.0 F0.1 F3.1 B3.0 B3.1 B0.0 B0.1",
                          "F1.0 F1.1 F2.0 F2.1 B2.0 B2.1 B1.0 B1.1"},
                         2);
  cycle.kind = ScheduleKind::kZeroBubbleV;
  cycle.placement = Placement::kV;
  ScheduleViolation v = MustViolate(cycle);
  EXPECT_EQ(v.rank, 0);
  EXPECT_EQ(ToString(v.action), "F3.0");
  EXPECT_THAT(v.reason, HasSubstr("deadlocks even with buffered sends"));
  EXPECT_THAT(v.reason, HasSubstr("rank 0's F3.0 waits for rank 1's F2.0"));
  EXPECT_THAT(v.reason, HasSubstr("rank 1's F1.1 waits for rank 0's F0.1"));
}

TEST(ValidatorTest, ZeroBubbleVNeedsBufferedSends) {
  auto s =
      GenerateSchedule(ScheduleKind::kZeroBubbleV,
                       {.ranks = 3, .microbatches = 5, .virtual_stages = 2});
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(ValidateSchedule(*s).ok()) << ValidateSchedule(*s);
  // The same order, checked as a rendezvous kind, deadlocks: rank 0's
  // fifth chunk-0 forward waits for rank 1, which is still sending up.
  s->kind = ScheduleKind::kInterleavedZeroBubble;
  ScheduleViolation v = MustViolate(*s);
  EXPECT_THAT(v.reason, HasSubstr("deadlocks under rendezvous sends"));
}

}  // namespace
}  // namespace conveyor::scheduler
