#include "cli/internal/plot_ticks.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::cli::plot_internal {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;

std::vector<std::string> Labels(const std::vector<Tick>& ticks) {
  std::vector<std::string> out;
  for (const Tick& t : ticks) out.push_back(t.label);
  return out;
}

TEST(NiceStepTest, RoundsToOneTwoOrFiveTimesAPowerOfTen) {
  EXPECT_DOUBLE_EQ(NiceStep(0.13), 0.1);
  EXPECT_DOUBLE_EQ(NiceStep(2.4), 2);
  EXPECT_DOUBLE_EQ(NiceStep(40), 50);
  EXPECT_DOUBLE_EQ(NiceStep(8000), 10000);
  EXPECT_DOUBLE_EQ(NiceStep(0), 1);
  EXPECT_DOUBLE_EQ(NiceStep(std::nan("")), 1);
}

TEST(TickLabelTest, OneUnitPerAxisAndNoTrailingZeros) {
  EXPECT_EQ(TickLabel(12500, 500, 20000), "12.5k");
  EXPECT_EQ(TickLabel(3e6, 1e6, 5e6), "3M");
  EXPECT_EQ(TickLabel(3e-4, 1e-4, 5e-4), "3e-4");
  EXPECT_EQ(TickLabel(2.5, 0.5, 10), "2.5");
  EXPECT_EQ(TickLabel(-1e-12, 0.5, 10), "0");
}

TEST(LinearTicksTest, EveryNiceStepWithinTheRange) {
  EXPECT_THAT(Labels(LinearTicks({0.3, 2.1}, 4, /*log_positions=*/false)),
              ElementsAre("0.5", "1", "1.5", "2"));
}

TEST(LogTicksTest, PowersOfTenWithTwoAndFiveOverAFewDecades) {
  // 1 to 100.
  EXPECT_THAT(Labels(LogTicks({0, 2}, 4)),
              ElementsAre("1", "2", "5", "10", "20", "50", "100"));
}

TEST(LogTicksTest, OnlyPowersOfTenOverManyDecades) {
  const std::vector<Tick> ticks = LogTicks({0, 20}, 4);
  ASSERT_FALSE(ticks.empty());
  EXPECT_LE(ticks.size(), 8u);
  for (const Tick& t : ticks) {
    const double e = std::log10(t.value);
    EXPECT_DOUBLE_EQ(e, std::round(e)) << t.label;
  }
}

TEST(LogTicksTest, ANarrowRangeFallsBackToLinearTicks) {
  // 2.1 to 2.9: no 1, 2, 3 or 5 times a power of ten but 2 (out) and 3 (out).
  const std::vector<Tick> ticks =
      LogTicks({std::log10(2.1), std::log10(2.9)}, 4);
  EXPECT_GE(ticks.size(), 2u);
  EXPECT_THAT(ticks, testing::Each(Field(&Tick::value, testing::Gt(2.0))));
}

}  // namespace
}  // namespace conveyor::cli::plot_internal
