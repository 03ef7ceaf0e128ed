#include "worker/drain_gate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor::worker {
namespace {

TEST(DrainGateTest, WithoutARequestNoBoundaryWaitsOrStops) {
  DrainGate gate;
  Cancellation never;
  gate.Begin(4);
  for (int64_t done = 4; done <= 9; ++done) {
    absl::StatusOr<bool> stop = gate.AtBoundary(done, 9, never);
    ASSERT_TRUE(stop.ok()) << stop.status();
    EXPECT_FALSE(*stop);
  }
  EXPECT_EQ(gate.stopped_after(), 0);
}

TEST(DrainGateTest, ARequestAnswersTheNextBoundary) {
  DrainGate gate;
  Cancellation never;
  gate.Begin(3);  // Resumed after step 2: the first boundary ends step 3.
  ASSERT_TRUE(gate.AtBoundary(3, 10, never).ok());
  EXPECT_EQ(gate.RequestStop(), 4);  // Running step 4.
}

// The protocol's point: ranks at different steps each answer their next
// boundary, the coordinator takes the largest, and every rank stops after
// exactly that step, none passing it while the answer is on its way.
TEST(DrainGateTest, RanksStopAfterTheLargestAnswerAndNoneGoesPast) {
  constexpr int kRanks = 4;
  constexpr int64_t kSteps = 1000;
  std::vector<DrainGate> gates(kRanks);
  Cancellation never;
  std::vector<int64_t> last_done(kRanks, 0);
  std::vector<std::thread> ranks;
  std::atomic<bool> go{false};
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      while (!go.load()) std::this_thread::yield();
      gates[r].Begin(1);
      for (int64_t done = 1; done <= kSteps; ++done) {
        // Ranks run at different speeds.
        std::this_thread::sleep_for(std::chrono::microseconds(50 * (r + 1)));
        last_done[r] = done;
        absl::StatusOr<bool> stop = gates[r].AtBoundary(done, kSteps, never);
        ASSERT_TRUE(stop.ok()) << stop.status();
        if (*stop) return;
      }
    });
  }
  go.store(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int64_t d = 0;
  for (DrainGate& g : gates) d = std::max(d, g.RequestStop());
  // The answer travels for a while; the ranks must hold meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  for (DrainGate& g : gates) g.StopAfter(d);
  for (std::thread& t : ranks) t.join();
  ASSERT_LT(d, kSteps);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(last_done[r], d) << "rank " << r;
    EXPECT_EQ(gates[r].stopped_after(), d) << "rank " << r;
  }
}

TEST(DrainGateTest, TheLastStepIsNeverAStopAndACancelEndsTheWait) {
  DrainGate gate;
  Cancellation cancel;
  gate.Begin(1);
  gate.RequestStop();
  // The job's last step: it ends anyway, and its final checkpoint is
  // written as always.
  absl::StatusOr<bool> last = gate.AtBoundary(5, 5, cancel);
  ASSERT_TRUE(last.ok());
  EXPECT_FALSE(*last);

  DrainGate waiting;
  waiting.Begin(1);
  waiting.RequestStop();
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel.Cancel(absl::CancelledError("job cancelled"));
  });
  absl::StatusOr<bool> stop = waiting.AtBoundary(1, 5, cancel);
  canceller.join();
  ASSERT_TRUE(stop.ok());
  EXPECT_FALSE(*stop);
  EXPECT_EQ(waiting.stopped_after(), 0);
}

TEST(DrainGateTest, AStopStepBehindTheRankIsAnError) {
  DrainGate gate;
  Cancellation never;
  gate.Begin(1);
  gate.StopAfter(2);
  ASSERT_TRUE(gate.AtBoundary(1, 9, never).ok());
  ASSERT_TRUE(*gate.AtBoundary(2, 9, never));
  DrainGate late;
  late.Begin(5);
  late.StopAfter(3);
  absl::StatusOr<bool> stop = late.AtBoundary(5, 9, never);
  EXPECT_EQ(stop.status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace conveyor::worker
