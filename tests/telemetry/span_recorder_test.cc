#include "telemetry/span_recorder.h"

#include <thread>

#include "gtest/gtest.h"

namespace conveyor::telemetry {
namespace {

TEST(SpanRecorderTest, BackToBackSpansTileTheStep) {
  SpanRecorder recorder;
  recorder.StartStep();
  auto t = recorder.step_start();
  for (int i = 0; i < 50; ++i) {
    t = recorder.Record(SpanKind::kForward, t, /*stage=*/1, /*microbatch=*/i);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const auto end = recorder.Record(SpanKind::kRecvWait, t, 1, 0, /*peer=*/0,
                                   /*bytes=*/64);
  ASSERT_EQ(recorder.spans().size(), 51u);
  // Rounding both ends from the step start makes the spans tile exactly:
  // their durations add up to the last end, with no accumulated error.
  int64_t sum = 0;
  int64_t expected_start = 0;
  for (const Span& s : recorder.spans()) {
    EXPECT_EQ(s.start_us, expected_start);
    expected_start += s.duration_us;
    sum += s.duration_us;
  }
  const int64_t elapsed = std::chrono::duration_cast<std::chrono::microseconds>(
                              end - recorder.step_start())
                              .count();
  EXPECT_EQ(sum, elapsed);
  const Span& last = recorder.spans().back();
  EXPECT_EQ(last.kind, SpanKind::kRecvWait);
  EXPECT_GE(last.duration_us, 2000);
  EXPECT_EQ(last.peer, 0);
  EXPECT_EQ(last.bytes, 64u);
  EXPECT_EQ(recorder.spans()[7].microbatch, 7);
  EXPECT_EQ(recorder.spans()[7].stage, 1);
}

TEST(SpanRecorderTest, StartStepClearsAndStampsWallClock) {
  SpanRecorder recorder;
  recorder.StartStep();
  recorder.Record(SpanKind::kOptimizer, recorder.Now());
  const int64_t before =
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count();
  recorder.StartStep();
  EXPECT_TRUE(recorder.spans().empty());
  EXPECT_GE(recorder.step_start_unix_us(), before);
  EXPECT_LT(recorder.step_start_unix_us(), before + 10'000'000);
}

TEST(SpanRecorderTest, ClassesAndNames) {
  EXPECT_EQ(ClassOf(SpanKind::kForward), SpanClass::kCompute);
  EXPECT_EQ(ClassOf(SpanKind::kBackwardWeight), SpanClass::kCompute);
  EXPECT_EQ(ClassOf(SpanKind::kLoss), SpanClass::kCompute);
  EXPECT_EQ(ClassOf(SpanKind::kData), SpanClass::kCompute);
  EXPECT_EQ(ClassOf(SpanKind::kOptimizer), SpanClass::kCompute);
  EXPECT_EQ(ClassOf(SpanKind::kSend), SpanClass::kCommunication);
  EXPECT_EQ(ClassOf(SpanKind::kAllReduce), SpanClass::kCommunication);
  EXPECT_EQ(ClassOf(SpanKind::kRecvWait), SpanClass::kIdle);
  EXPECT_STREQ(SpanKindName(SpanKind::kRecvWait), "recv wait");
  EXPECT_STREQ(SpanKindName(SpanKind::kBackwardInput), "backward input");
}

}  // namespace
}  // namespace conveyor::telemetry

namespace conveyor::telemetry {
namespace {

TEST(SpanRecorderTest, DisabledRecordsNothing) {
  SpanRecorder recorder(/*enabled=*/false);
  EXPECT_FALSE(recorder.enabled());
  recorder.StartStep();
  const auto t = recorder.Now();
  EXPECT_EQ(t, SpanRecorder::Clock::time_point());
  EXPECT_EQ(recorder.Record(SpanKind::kForward, t, 0, 0), t);
  EXPECT_TRUE(recorder.spans().empty());
  EXPECT_EQ(recorder.step_start_unix_us(), 0);
}

}  // namespace
}  // namespace conveyor::telemetry
