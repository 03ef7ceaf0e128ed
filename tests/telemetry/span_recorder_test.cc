#include "telemetry/span_recorder.h"

#include <thread>

#include "gtest/gtest.h"

namespace conveyor::telemetry {
namespace {

TEST(SpanRecorderTest, SpansTileTheStepWhateverRunsBetweenThem) {
  SpanRecorder recorder;
  recorder.StartStep();
  for (int i = 0; i < 50; ++i) {
    recorder.Record(SpanKind::kForward, /*stage=*/1, /*microbatch=*/i);
  }
  // Time between two Record calls (the executor's bookkeeping, or the
  // thread descheduled) belongs to the span that follows, not to a gap.
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const auto end = recorder.Record(SpanKind::kRecvWait, 1, 0, /*peer=*/0,
                                   /*bytes=*/64);
  ASSERT_EQ(recorder.spans().size(), 51u);
  // Each span starts where the previous ended, and ends are rounded from the
  // step start, so the durations add up to the last end exactly.
  int64_t sum = 0;
  int64_t expected_start = 0;
  for (const Span& s : recorder.spans()) {
    EXPECT_EQ(s.start_us, expected_start);
    EXPECT_GE(s.duration_us, 0);
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
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  recorder.Record(SpanKind::kOptimizer);
  const int64_t before =
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count();
  recorder.StartStep();
  EXPECT_TRUE(recorder.spans().empty());
  // The next step's first span starts at that step's start, not where the
  // previous step's last span ended.
  recorder.Record(SpanKind::kForward);
  EXPECT_EQ(recorder.spans().at(0).start_us, 0);
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
  EXPECT_EQ(recorder.Record(SpanKind::kForward, 0, 0),
            SpanRecorder::Clock::time_point());
  EXPECT_TRUE(recorder.spans().empty());
  EXPECT_EQ(recorder.step_start_unix_us(), 0);
}

}  // namespace
}  // namespace conveyor::telemetry
