#include "common/host_memory.h"

#include <cstdint>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

TEST(HostMemoryTest, ReadsAPlausibleAvailableAmount) {
  const std::optional<uint64_t> available = AvailableHostMemoryBytes();
  ASSERT_TRUE(available.has_value()) << "no MemAvailable in /proc/meminfo";
  EXPECT_GT(*available, uint64_t{1} << 20);  // More than a MiB,
  EXPECT_LT(*available, uint64_t{1} << 50);  // less than a PiB.
}

TEST(HostMemoryTest, RefusesWhatCannotFitAndSaysHowMuch) {
  EXPECT_TRUE(CheckHostAllocation(4096, "a page").ok());
  const absl::Status status =
      CheckHostAllocation(uint64_t{4} << 40, "the data source's W");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(),
              HasSubstr("the data source's W needs 4.0 TiB of host memory and "
                        "this machine has "));
}

TEST(HostMemoryTest, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(3 * 1024), "3.0 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 30), "3.0 GiB");
  EXPECT_EQ(FormatBytes(~uint64_t{0}), "16.0 EiB");
}

}  // namespace
}  // namespace conveyor
