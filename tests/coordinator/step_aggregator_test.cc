#include "coordinator/step_aggregator.h"

#include <cmath>

#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

v1::StepReport Report(int64_t step, double seconds, double wait,
                      std::optional<float> loss = std::nullopt) {
  v1::StepReport r;
  r.set_step(step);
  r.set_seconds(seconds);
  r.set_wait_seconds(wait);
  r.set_learning_rate(0.01f);
  if (loss) {
    r.set_has_loss(true);
    r.set_loss(*loss);
  }
  return r;
}

TEST(SummarizeStepTest, TakesTheSlowestRankTheLossAndTheMeanBubble) {
  const v1::StepSummary s =
      SummarizeStep(3, {Report(3, 2.0, 0.5), Report(3, 4.0, 1.0, 0.25f)},
                    {.samples_per_step = 8, .tokens_per_sample = 16});
  EXPECT_EQ(s.step(), 3);
  EXPECT_EQ(s.seconds(), 4.0);
  EXPECT_TRUE(s.has_loss());
  EXPECT_EQ(s.loss(), 0.25f);
  // (0.5 / 2 + 1 / 4) / 2: each rank's share of waiting, averaged.
  EXPECT_DOUBLE_EQ(s.receive_wait_fraction(), 0.25);
  // No spans, no timeline: no schedule bubble to report.
  EXPECT_EQ(s.bubble_fraction(), 0);
  EXPECT_DOUBLE_EQ(s.samples_per_second(), 2.0);
  EXPECT_DOUBLE_EQ(s.tokens_per_second(), 32.0);
  ASSERT_EQ(s.ranks_size(), 2);
  EXPECT_EQ(s.ranks(1).rank(), 1);
  EXPECT_EQ(s.ranks(1).wait_seconds(), 1.0);
}

// The step line's memory is the fullest rank's (by reserved bytes), whole;
// TFLOP/s per device divides the model's FLOP/s by ranks x devices each.
TEST(SummarizeStepTest, ReportsTheFullestRanksMemoryAndFlopsPerDevice) {
  v1::StepReport a = Report(1, 2.0, 0), b = Report(1, 2.0, 0);
  a.set_peak_memory_allocated_bytes(900);
  a.set_peak_memory_reserved_bytes(1000);
  a.set_memory_capacity_bytes(8000);
  b.set_peak_memory_allocated_bytes(1500);  // More allocated, less reserved.
  b.set_peak_memory_reserved_bytes(1600);
  b.set_memory_capacity_bytes(4000);
  const v1::StepSummary s = SummarizeStep(
      1, {a, b},
      {.samples_per_step = 8, .flops_per_sample = 3e12, .devices_per_rank = 2});
  EXPECT_EQ(s.peak_memory_allocated_bytes(), 1500u);
  EXPECT_EQ(s.peak_memory_reserved_bytes(), 1600u);
  EXPECT_EQ(s.memory_capacity_bytes(), 4000u);
  EXPECT_EQ(s.ranks(0).peak_memory_reserved_bytes(), 1000u);
  EXPECT_EQ(s.ranks(1).memory_capacity_bytes(), 4000u);
  // 4 samples/s x 3 TFLOP each over 2 ranks x 2 devices.
  EXPECT_DOUBLE_EQ(s.tflops_per_device(), 3.0);
  EXPECT_EQ(s.mfu(), 0);  // No device peak known.
  // Ranks that count nothing leave the memory out.
  const v1::StepSummary none =
      SummarizeStep(1, {Report(1, 1.0, 0)}, {.samples_per_step = 8});
  EXPECT_EQ(none.peak_memory_reserved_bytes(), 0u);
  EXPECT_EQ(none.tflops_per_device(), 0);
}

void AddSpan(v1::StepReport& r, v1::Span::Kind kind, int stage, int64_t start,
             int64_t duration) {
  v1::Span* s = r.add_spans();
  s->set_kind(kind);
  s->set_stage(stage);
  s->set_start_us(start);
  s->set_duration_us(duration);
}

// The schedule bubble from the ranks' timelines, as the trace SVG draws
// them: a forward's box takes in its data read and loss; sends, receive
// waits and the optimizer are not actions; each rank's clock starts at its
// own start_unix_us.
TEST(SummarizeStepTest, TheBubbleIsTheIdleAreaOfTheStepsTimeline) {
  v1::StepReport a = Report(1, 1, 0), b = Report(1, 1, 0, 1.0f);
  a.set_start_unix_us(5000);
  AddSpan(a, v1::Span::DATA, 0, 0, 50);
  AddSpan(a, v1::Span::FORWARD, 0, 50, 50);  // Box 0..100.
  AddSpan(a, v1::Span::SEND, 0, 100, 10);
  AddSpan(a, v1::Span::RECV_WAIT, 0, 110, 390);
  AddSpan(a, v1::Span::BACKWARD, 0, 500, 100);  // Box 500..600.
  AddSpan(a, v1::Span::OPTIMIZER, -1, 600, 400);
  b.set_start_unix_us(5100);                    // Starts 100 us later.
  AddSpan(b, v1::Span::FORWARD, 1, 0, 100);     // 100..200 on a's clock.
  AddSpan(b, v1::Span::LOSS, 1, 100, 100);      // Forward box to 300.
  AddSpan(b, v1::Span::BACKWARD, 1, 200, 200);  // 300..500.
  const v1::StepSummary s = SummarizeStep(1, {a, b}, {8, 0});
  // Makespan 600 us; busy 100 + 100 + 200 + 200 = 600 of 2 x 600.
  EXPECT_DOUBLE_EQ(s.bubble_fraction(), 0.5);
}

// The global gradient norm is the root of the ranks' sums of squares; the
// MFU is the model's FLOP/s over the job's peak, and absent without one.
TEST(SummarizeStepTest, SumsTheGradientNormAndComputesTheMfu) {
  v1::StepReport a = Report(1, 2.0, 0), b = Report(1, 2.0, 0, 1.0f);
  a.set_grad_squared_sum(36);
  b.set_grad_squared_sum(64);
  StepRates rates{.samples_per_step = 8,
                  .tokens_per_sample = 0,
                  .flops_per_sample = 1e9,
                  .peak_flops = 16e9};
  const v1::StepSummary s = SummarizeStep(1, {a, b}, rates);
  EXPECT_DOUBLE_EQ(s.grad_norm(), 10);
  // 4 samples/s x 1 GFLOP over 16 GFLOP/s.
  EXPECT_DOUBLE_EQ(s.mfu(), 0.25);
  rates.peak_flops = 0;
  EXPECT_EQ(SummarizeStep(1, {a, b}, rates).mfu(), 0);
  // A NaN from a broken worker reports no norm rather than NaN.
  a.set_grad_squared_sum(std::nan(""));
  EXPECT_EQ(SummarizeStep(1, {a, b}, rates).grad_norm(), 0);
}

// Every rank reports that an evaluation followed the step and how long its
// part took; only the last stage's rank has the loss.
TEST(SummarizeStepTest, TakesTheEvaluationFromTheLastStageAndTheSlowestTime) {
  v1::StepReport first = Report(4, 1.0, 0.1), last = Report(4, 1.0, 0, 0.5f);
  first.set_has_eval(true);
  first.set_eval_seconds(0.75);
  last.set_has_eval(true);
  last.set_eval_seconds(0.5);
  last.set_eval_has_loss(true);
  last.set_eval_loss(0.625);
  last.set_eval_perplexity(1.868);
  const v1::StepSummary s = SummarizeStep(4, {first, last}, {8, 0});
  EXPECT_TRUE(s.has_eval());
  EXPECT_EQ(s.eval_loss(), 0.625);
  EXPECT_EQ(s.eval_perplexity(), 1.868);
  EXPECT_EQ(s.eval_seconds(), 0.75);
  EXPECT_FALSE(
      SummarizeStep(5, {Report(5, 1, 0), Report(5, 1, 0, 0.5f)}, {8, 0})
          .has_eval());
}

TEST(SummarizeStepTest, AZeroTimeStepHasNoRates) {
  const v1::StepSummary s = SummarizeStep(1, {Report(1, 0, 0)}, {8, 16});
  EXPECT_EQ(s.samples_per_second(), 0);
  EXPECT_EQ(s.bubble_fraction(), 0);
}

TEST(StepAggregatorTest, SummarizesOnceEveryRankReported) {
  StepAggregator steps(/*trace_steps=*/4);
  EXPECT_FALSE(steps.Add(1, 2, Report(1, 1, 0), {}).has_value());
  // A second report of rank 1 is ignored, not counted as rank 0's.
  EXPECT_FALSE(steps.Add(1, 2, Report(1, 9, 0), {}).has_value());
  // Steps may complete out of order.
  EXPECT_FALSE(steps.Add(0, 2, Report(2, 1, 0), {}).has_value());
  auto one = steps.Add(0, 2, Report(1, 2, 0), {});
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->step(), 1);
  EXPECT_EQ(one->seconds(), 2);  // Rank 1's first report, not its second.
  auto two = steps.Add(1, 2, Report(2, 1, 0), {});
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->step(), 2);
  EXPECT_EQ(steps.Find(0)->first, 2);
  EXPECT_EQ(steps.Find(1)->second.size(), 2u);
  EXPECT_EQ(steps.Find(5), nullptr);
  EXPECT_FALSE(steps.Add(2, 2, Report(3, 1, 0), {}).has_value());
  EXPECT_FALSE(steps.Add(-1, 2, Report(3, 1, 0), {}).has_value());
}

TEST(StepAggregatorTest, KeepsTheNewestTimelinesOnly) {
  StepAggregator steps(/*trace_steps=*/2);
  for (int step = 1; step <= 5; ++step) {
    ASSERT_TRUE(steps.Add(0, 1, Report(step, 1, 0), {}).has_value());
  }
  ASSERT_EQ(steps.timelines().size(), 2u);
  EXPECT_EQ(steps.timelines().front().first, 4);
  EXPECT_EQ(steps.Find(3), nullptr);
  steps.ClearTimelines();
  EXPECT_EQ(steps.Find(0), nullptr);
}

TEST(StepAggregatorTest, ClearPendingForgetsAnIncompleteStep) {
  StepAggregator steps(4);
  EXPECT_FALSE(steps.Add(0, 2, Report(1, 1, 0), {}).has_value());
  steps.ClearPending();
  // The next attempt's ranks report step 1 afresh.
  EXPECT_FALSE(steps.Add(1, 2, Report(1, 1, 0), {}).has_value());
  EXPECT_TRUE(steps.Add(0, 2, Report(1, 1, 0), {}).has_value());
}

}  // namespace
}  // namespace conveyor::coordinator
