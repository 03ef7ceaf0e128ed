#include "coordinator/ids.h"

#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

TEST(IdsTest, NumbersRoundTrip) {
  EXPECT_EQ(JobId(7), "job-7");
  EXPECT_EQ(WorkerId(12), "worker-12");
  EXPECT_EQ(JobNumber(JobId(uint64_t{1} << 40)), uint64_t{1} << 40);
  EXPECT_EQ(WorkerNumber(WorkerId(3)), 3);
}

TEST(IdsTest, AnythingElseIsZero) {
  for (const char* id : {"", "job-", "job-x", "worker-3", "job-1x", "jobs-1",
                         "job-99999999999999999999"}) {
    EXPECT_EQ(JobNumber(id), 0u) << id;
  }
  for (const char* id : {"", "worker-", "job-3", "worker-x"}) {
    EXPECT_EQ(WorkerNumber(id), 0) << id;
  }
}

}  // namespace
}  // namespace conveyor::coordinator
