#include "common/check.h"

#include "gtest/gtest.h"

namespace conveyor {
namespace {

int Evaluations(int* counter) { return ++*counter; }

TEST(CheckTest, PassingCheckEvaluatesItsConditionOnce) {
  int counter = 0;
  CONVEYOR_CHECK(Evaluations(&counter) == 1, "evaluated once");
  EXPECT_EQ(counter, 1);
}

TEST(CheckDeathTest, FailingCheckAbortsWithFileLineExpressionAndMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int begin = 3, end = 2;
  EXPECT_DEATH(CONVEYOR_CHECK(begin <= end, "stage bounds out of order"),
               "check_test\\.cc:[0-9]+: check failed: begin <= end: "
               "stage bounds out of order");
}

}  // namespace
}  // namespace conveyor
