#include "cli/core_shares.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(CoreSharesTest, EachWorkerGetsADisjointShareAndThatManyThreads) {
  const CoreShares s = PlanCoreShares(
      {.cores = {0, 1, 2, 3, 4, 5, 6}, .workers = 3, .devices_per_stage = 1});
  EXPECT_THAT(s.worker_devices, ElementsAre("cpu:2"));
  EXPECT_THAT(s.worker_cpu_cores, ElementsAre("0-1", "2-3", "4-5"));
  EXPECT_EQ(s.description, "2 cores each, pinned to 0-1 | 2-3 | 4-5");
}

TEST(CoreSharesTest, TwoWorkersOnTwoCoresGetOneEach) {
  const CoreShares s = PlanCoreShares({.cores = {0, 1}, .workers = 2});
  EXPECT_THAT(s.worker_devices, ElementsAre("cpu:1"));
  EXPECT_THAT(s.worker_cpu_cores, ElementsAre("0", "1"));
  EXPECT_EQ(s.description, "1 core each, pinned to 0 | 1");
}

// The cores of a taskset or cpuset need not start at 0 or be contiguous.
TEST(CoreSharesTest, FollowsTheAllowedCoresWhereverTheyAre) {
  const CoreShares s = PlanCoreShares({.cores = {2, 3, 8, 9}, .workers = 2});
  EXPECT_THAT(s.worker_cpu_cores, ElementsAre("2-3", "8-9"));
}

TEST(CoreSharesTest, AMeshSplitsItsWorkersShare) {
  const CoreShares four = PlanCoreShares({.cores = {0, 1, 2, 3, 4, 5, 6, 7},
                                          .workers = 2,
                                          .devices_per_stage = 2});
  EXPECT_THAT(four.worker_devices, ElementsAre("cpu:2,cpu:2"));
  // Fewer cores than devices: one thread per device, sharing the share.
  const CoreShares one =
      PlanCoreShares({.cores = {0, 1}, .workers = 2, .devices_per_stage = 2});
  EXPECT_THAT(one.worker_devices, ElementsAre("cpu:1,cpu:1"));
  EXPECT_THAT(one.worker_cpu_cores, ElementsAre("0", "1"));
}

TEST(CoreSharesTest, FewerCoresThanWorkersPinsNobody) {
  const CoreShares s = PlanCoreShares({.cores = {0, 1}, .workers = 3});
  EXPECT_THAT(s.worker_devices, ElementsAre("cpu:1"));
  EXPECT_THAT(s.worker_cpu_cores, IsEmpty());
  EXPECT_EQ(s.description,
            "3 workers sharing 2 core(s): 1 thread each, not pinned");
}

TEST(CoreSharesTest, NoPinKeepsTheThreadsButPinsNobody) {
  const CoreShares s =
      PlanCoreShares({.cores = {0, 1, 2, 3}, .workers = 2, .pin = false});
  EXPECT_THAT(s.worker_devices, ElementsAre("cpu:2"));
  EXPECT_THAT(s.worker_cpu_cores, IsEmpty());
  EXPECT_EQ(s.description, "2 cores each, not pinned (--no-pin)");
}

TEST(CoreSharesTest, TheUsersDevicesAreKept) {
  const CoreShares cpu = PlanCoreShares(
      {.cores = {0, 1, 2, 3}, .workers = 2, .devices = {"cpu:1"}});
  EXPECT_THAT(cpu.worker_devices, IsEmpty());  // --devices cpu:1 as given.
  EXPECT_THAT(cpu.worker_cpu_cores, ElementsAre("0-1", "2-3"));
  // GPU workers: neither threads nor pinning.
  const CoreShares gpu = PlanCoreShares(
      {.cores = {0, 1, 2, 3}, .workers = 2, .devices = {"cuda:0"}});
  EXPECT_THAT(gpu.worker_devices, IsEmpty());
  EXPECT_THAT(gpu.worker_cpu_cores, IsEmpty());
  EXPECT_EQ(gpu.description, "on the devices given");
}

}  // namespace
}  // namespace conveyor::cli
