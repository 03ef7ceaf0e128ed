#include "engine/device_peak.h"

#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

// The datasheet figures the table must reproduce, from the SM count and the
// maximum clock each part reports (relative 5e-3: datasheets print three or
// four significant figures).
TEST(DevicePeakTest, ReproducesDatasheetPeaks) {
  struct Case {
    const char* part;
    GpuComputeUnits units;
    Precision precision;
    double datasheet_tflops;
  };
  const Case cases[] = {
      // A100 SXM: 108 SMs, 1410 MHz.
      {"A100 bf16", {8, 0, 108, 1410e3}, Precision::kBf16, 311.87},
      {"A100 fp32", {8, 0, 108, 1410e3}, Precision::kFp32, 19.49},
      // H100 SXM: 132 SMs, 1980 MHz (fp32 is quoted at the boost clock).
      {"H100 fp32", {9, 0, 132, 1980e3}, Precision::kFp32, 66.9},
      // H100 SXM bf16 is quoted at 1830 MHz: 989.4 TFLOP/s.
      {"H100 bf16", {9, 0, 132, 1830e3}, Precision::kBf16, 989.4},
      // A40: 84 SMs, 1740 MHz; 149.7 bf16, 37.4 fp32.
      {"A40 bf16", {8, 6, 84, 1740e3}, Precision::kBf16, 149.7},
      {"A40 fp32", {8, 6, 84, 1740e3}, Precision::kFp32, 37.4},
      // V100 SXM2: 80 SMs, 1530 MHz; 15.7 fp32.
      {"V100 fp32", {7, 0, 80, 1530e3}, Precision::kFp32, 15.7},
  };
  for (const Case& c : cases) {
    const double tflops = GpuPeakFlops(c.units, c.precision) / 1e12;
    EXPECT_NEAR(tflops, c.datasheet_tflops, 5e-3 * c.datasheet_tflops)
        << c.part;
  }
}

TEST(DevicePeakTest, HopperDoublesAmperePerSmAndClock) {
  EXPECT_EQ(FlopsPerSmPerClock(9, 0, Precision::kBf16),
            2 * FlopsPerSmPerClock(8, 0, Precision::kBf16));
  EXPECT_EQ(FlopsPerSmPerClock(10, 0, Precision::kBf16),
            2 * FlopsPerSmPerClock(9, 0, Precision::kBf16));
}

// No bf16 tensor cores before sm_80, and architectures the table does not
// know: no peak, so no MFU, rather than a guess.
TEST(DevicePeakTest, UnknownOrUnsupportedIsZero) {
  EXPECT_EQ(FlopsPerSmPerClock(7, 0, Precision::kBf16), 0);
  EXPECT_EQ(FlopsPerSmPerClock(7, 5, Precision::kBf16), 0);
  EXPECT_EQ(FlopsPerSmPerClock(5, 2, Precision::kFp32), 0);
  EXPECT_EQ(FlopsPerSmPerClock(11, 0, Precision::kFp32), 0);
  EXPECT_EQ(GpuPeakFlops({11, 0, 100, 2e6}, Precision::kBf16), 0);
}

TEST(DevicePeakTest, MissingOrNonsenseUnitsAreZero) {
  EXPECT_EQ(GpuPeakFlops({9, 0, 0, 1980e3}, Precision::kBf16), 0);
  EXPECT_EQ(GpuPeakFlops({9, 0, 132, 0}, Precision::kBf16), 0);
  EXPECT_EQ(GpuPeakFlops({9, 0, -1, 1980e3}, Precision::kBf16), 0);
  EXPECT_EQ(GpuPeakFlops({9, 0, 132, -5}, Precision::kFp32), 0);
  EXPECT_EQ(GpuPeakFlops({9, 0, 132, 1.0 / 0.0}, Precision::kFp32), 0);
}

}  // namespace
}  // namespace conveyor::engine
