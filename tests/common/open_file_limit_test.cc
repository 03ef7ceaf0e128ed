#include "common/open_file_limit.h"

#include <sys/resource.h>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

TEST(OpenFileLimitTest, RaisesTheSoftLimitToTheHardOne) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  if (before.rlim_max == RLIM_INFINITY || before.rlim_max < 2) {
    GTEST_SKIP() << "no finite hard limit to test against";
  }
  rlimit lowered = before;
  lowered.rlim_cur = before.rlim_max / 2;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  EXPECT_EQ(RaiseOpenFileLimit(), static_cast<int64_t>(before.rlim_max));
  rlimit after{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_EQ(after.rlim_cur, before.rlim_max);
  EXPECT_EQ(after.rlim_max, before.rlim_max);  // The hard limit is kept.
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &before), 0);
}

}  // namespace
}  // namespace conveyor
