#include "engine/cpu/parallel.h"

#include <sched.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

// The parts ParallelChunks split [0, n) into, sorted.
std::vector<std::pair<int64_t, int64_t>> Parts(int64_t n) {
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> parts;
  ParallelChunks(n, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    parts.emplace_back(begin, end);
  });
  std::sort(parts.begin(), parts.end());
  return parts;
}

// Whatever the thread count, the parts tile [0, n) exactly once.
void ExpectTiles(const std::vector<std::pair<int64_t, int64_t>>& parts,
                 int64_t n) {
  ASSERT_FALSE(parts.empty());
  EXPECT_EQ(parts.front().first, 0);
  EXPECT_EQ(parts.back().second, n);
  for (size_t i = 1; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].first, parts[i - 1].second);
  }
}

TEST(ParallelTest, DefaultsToTheCoresThisProcessMayUse) {
  SetCpuThreads(0);
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(CpuThreads(), CPU_COUNT(&set));
}

// A worker's cpu:N: loops split into N parts, more or fewer than the
// machine's cores, and back.
TEST(ParallelTest, SplitsLoopsIntoAsManyPartsAsThreadsGiven) {
  constexpr int64_t kN = 1000;
  for (int threads : {1, 3, 2, 5, 1}) {
    SetCpuThreads(threads);
    EXPECT_EQ(CpuThreads(), threads);
    const std::vector<std::pair<int64_t, int64_t>> parts = Parts(kN);
    EXPECT_EQ(parts.size(), static_cast<size_t>(threads)) << threads;
    ExpectTiles(parts, kN);
  }
  // Fewer elements than threads: no empty part runs.
  SetCpuThreads(5);
  EXPECT_EQ(Parts(3).size(), 3u);  // One element each; parts 3 and 4 idle.
  ExpectTiles(Parts(3), 3);
  SetCpuThreads(0);
}

}  // namespace
}  // namespace conveyor::engine
