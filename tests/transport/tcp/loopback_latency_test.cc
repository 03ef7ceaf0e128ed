#include "transport/tcp/loopback_latency.h"

#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::transport {
namespace {

// A transfer takes some time and far less than a second on any machine
// (no timing is asserted beyond that: the figure is the planner's input,
// its size is the benchmark's business).
TEST(LoopbackLatencyTest, MeasuresAPositiveSubSecondTime) {
  absl::StatusOr<double> seconds = MeasureLoopbackLatency(
      engine::CpuBackend::Get(), 5, std::chrono::milliseconds(1));
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_GT(*seconds, 0);
  EXPECT_LT(*seconds, 1);
}

TEST(LoopbackLatencyTest, RejectsOptionsOutOfRange) {
  EXPECT_THAT(MeasureLoopbackLatency(engine::CpuBackend::Get(), 0,
                                     std::chrono::milliseconds(1))
                  .status()
                  .message(),
              ::testing::HasSubstr("samples 0 (1..1000)"));
  EXPECT_EQ(MeasureLoopbackLatency(engine::CpuBackend::Get(), 3,
                                   std::chrono::milliseconds(101))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor::transport
