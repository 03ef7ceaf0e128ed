#include "common/cpu_set.h"

#include <sched.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CpuSetTest, ParsesListsAndRanges) {
  EXPECT_THAT(*ParseCpuList("0"), ElementsAre(0));
  EXPECT_THAT(*ParseCpuList("0-3,8,10-11"), ElementsAre(0, 1, 2, 3, 8, 10, 11));
  // Any order, spaces around parts; the result is sorted.
  EXPECT_THAT(*ParseCpuList(" 8, 2-3 ,0 "), ElementsAre(0, 2, 3, 8));
  EXPECT_THAT(*ParseCpuList("5-5"), ElementsAre(5));
}

TEST(CpuSetTest, RefusesBadListsNamingThePart) {
  struct Case {
    const char* list;
    const char* says;
  };
  for (const Case& c :
       {Case{"", "empty"}, Case{"a", "'a'"}, Case{"1,,2", "''"},
        Case{"-1", "'-1'"}, Case{"3-1", "backwards"}, Case{"1-2-3", "'1-2-3'"},
        Case{"0-1,1", "core 1 is named twice"},
        Case{"1024", "largest core number, 1023"},
        Case{"99999999999999", "largest core number"}, Case{"+1", "'+1'"}}) {
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(c.list);
    ASSERT_FALSE(cpus.ok()) << c.list;
    EXPECT_EQ(cpus.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(cpus.status().message(), HasSubstr(c.says)) << c.list;
  }
}

TEST(CpuSetTest, FormatsRangesAndRoundTrips) {
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(FormatCpuList({3}), "3");
  EXPECT_EQ(FormatCpuList({11, 0, 1, 2, 3, 8, 10}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({1, 1, 2}), "1-2");
  for (const char* list : {"0", "0-3,8,10-11", "1,3,5", "0-1023"}) {
    EXPECT_EQ(FormatCpuList(*ParseCpuList(list)), list);
  }
}

TEST(CpuSetTest, SplitsIntoDisjointEqualShares) {
  const std::vector<int> cpus = {0, 1, 2, 3, 4, 5, 6};
  const std::vector<std::vector<int>> two = SplitCpus(cpus, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_THAT(two[0], ElementsAre(0, 1, 2));
  EXPECT_THAT(two[1], ElementsAre(3, 4, 5));
  EXPECT_EQ(SplitCpus(cpus, 7).size(), 7u);
  EXPECT_THAT(SplitCpus(cpus, 7)[6], ElementsAre(6));
  // Fewer cores than workers: no shares, so no core is pinned twice.
  EXPECT_TRUE(SplitCpus(cpus, 8).empty());
  EXPECT_TRUE(SplitCpus(cpus, 0).empty());
}

std::vector<int> MaskOf(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(tid, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// Threads that exist before the call (as OpenBLAS's do) and threads created
// after it both end up on the chosen core.
TEST(CpuSetTest, PinsThreadsBeforeAndAfter) {
  const absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_FALSE(allowed->empty());
  const std::vector<int> one = {allowed->back()};

  std::atomic<pid_t> earlier_tid{0};
  std::atomic<bool> pinned{false};
  std::vector<int> earlier_mask;
  std::thread earlier([&] {
    earlier_tid = gettid();
    while (!pinned) std::this_thread::yield();
    earlier_mask = MaskOf(0);
  });
  while (earlier_tid == 0) std::this_thread::yield();

  ASSERT_TRUE(PinProcess(one).ok());
  pinned = true;
  earlier.join();
  std::vector<int> later_mask;
  std::thread later([&] { later_mask = MaskOf(0); });
  later.join();
  EXPECT_EQ(earlier_mask, one);
  EXPECT_EQ(later_mask, one);
  EXPECT_EQ(MaskOf(0), one);
  EXPECT_EQ(*AllowedCpus(), one);

  // Back to where it started, for the tests after this one.
  ASSERT_TRUE(PinProcess(*allowed).ok());
  EXPECT_EQ(*AllowedCpus(), *allowed);
}

TEST(CpuSetTest, RefusesCoresOutsideTheAllowedSet) {
  const std::vector<int> allowed = *AllowedCpus();
  if (allowed.back() == kMaxCpu) GTEST_SKIP() << "a 1024-core machine";
  const absl::Status s = PinProcess({kMaxCpu});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("core 1023 is not available to this process (it "
                        "runs on " +
                        FormatCpuList(allowed) + ")"));
  // Partly available: refused too, naming only the missing core, and the
  // mask is restored rather than quietly narrowed.
  const absl::Status partly = PinProcess({allowed.front(), kMaxCpu});
  EXPECT_EQ(partly.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(partly.message(), HasSubstr("core 1023 is not available"));
  EXPECT_EQ(PinProcess({-1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PinProcess({}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*AllowedCpus(), allowed);  // Nothing changed.
}

}  // namespace
}  // namespace conveyor
