// The host tensor-parallel group's collectives, run by real threads (one per
// rank, as RankThreads runs them), and what happens when a rank fails before
// a collective: the others are released, never left waiting.
#include "engine/tensor_parallel.h"

#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/internal/rank_threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::FromVector;
using testing_util::ToVector;

// Rank r's tensor: rows of (10 r + row, 100 r + row); exact in f32.
Tensor RankInput(int rank, int rows) {
  std::vector<float> v;
  for (int i = 0; i < rows; ++i) {
    v.push_back(10.0f * rank + i);
    v.push_back(100.0f * rank + i);
  }
  return FromVector({rows, 2}, v);
}

TEST(TensorParallelGroupTest, AllReduceGivesEveryRankTheSum) {
  constexpr int kRanks = 3;
  auto group = *CreateHostTensorParallelGroup(kRanks);
  RankThreads threads(kRanks);
  std::vector<Tensor> out(kRanks);
  ASSERT_TRUE(threads
                  .Run(
                      [&](int r) -> absl::Status {
                        const Tensor x = RankInput(r, 2);
                        out[r] = *CpuBackend::Get()->Empty({2, 2}, DType::kF32);
                        return group->AllReduceSum(r, x, out[r]);
                      },
                      [&](const absl::Status& s) { group->Abort(s); })
                  .ok());
  // Rows: sum over r of 10 r + i = 30 + 3 i and 100 r + i = 300 + 3 i.
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(ToVector(out[r]), (std::vector<float>{30, 300, 33, 303})) << r;
  }
}

TEST(TensorParallelGroupTest, ReduceScatterAndAllGatherAreInverseBlocks) {
  constexpr int kRanks = 2;
  auto group = *CreateHostTensorParallelGroup(kRanks);
  RankThreads threads(kRanks);
  std::vector<Tensor> scattered(kRanks), gathered(kRanks);
  ASSERT_TRUE(threads
                  .Run(
                      [&](int r) -> absl::Status {
                        Backend* cpu = CpuBackend::Get();
                        scattered[r] = *cpu->Empty({2, 2}, DType::kF32);
                        RETURN_IF_ERROR(group->ReduceScatterRows(
                            r, RankInput(r, 4), scattered[r]));
                        gathered[r] = *cpu->Empty({4, 2}, DType::kF32);
                        return group->AllGatherRows(r, scattered[r],
                                                    gathered[r]);
                      },
                      [&](const absl::Status& s) { group->Abort(s); })
                  .ok());
  // The sum of the two ranks' rows is (10 + 2 i, 100 + 2 i); rank 0 holds
  // rows 0-1 of it, rank 1 rows 2-3, and the gather puts them back in order.
  EXPECT_EQ(ToVector(scattered[0]), (std::vector<float>{10, 100, 12, 102}));
  EXPECT_EQ(ToVector(scattered[1]), (std::vector<float>{14, 104, 16, 106}));
  const std::vector<float> whole = {10, 100, 12, 102, 14, 104, 16, 106};
  EXPECT_EQ(ToVector(gathered[0]), whole);
  EXPECT_EQ(ToVector(gathered[1]), whole);
}

TEST(TensorParallelGroupTest, ARankThatFailsReleasesTheOthers) {
  constexpr int kRanks = 3;
  auto group = *CreateHostTensorParallelGroup(kRanks);
  RankThreads threads(kRanks);
  // Ranks 0 and 2 wait in the all-reduce; rank 1 fails before it. Without
  // the abort this test would never end.
  const absl::Status status = threads.Run(
      [&](int r) -> absl::Status {
        if (r == 1) return absl::ResourceExhaustedError("rank 1 ran out");
        Tensor x = RankInput(r, 1);
        return group->AllReduceSum(r, x, x);
      },
      [&](const absl::Status& s) { group->Abort(s); });
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted)
      << "the lowest failed rank's error, not the released ranks'";
  // Until Reset, every collective fails at once; afterwards they work.
  Tensor x = RankInput(0, 1);
  EXPECT_EQ(group->AllReduceSum(0, x, x).code(),
            absl::StatusCode::kResourceExhausted);
  group->Reset();
  ASSERT_TRUE(threads
                  .Run(
                      [&](int r) -> absl::Status {
                        Tensor y = RankInput(r, 1);
                        RETURN_IF_ERROR(group->AllReduceSum(r, y, y));
                        EXPECT_EQ(ToVector(y), (std::vector<float>{30, 300}));
                        return absl::OkStatus();
                      },
                      [&](const absl::Status& s) { group->Abort(s); })
                  .ok());
}

TEST(TensorParallelGroupTest, RefusesBadCalls) {
  auto group = *CreateHostTensorParallelGroup(2);
  Tensor x = RankInput(0, 3);
  EXPECT_THAT(group->AllReduceSum(2, x, x).message(), HasSubstr("rank 2"));
  Tensor small = *CpuBackend::Get()->Empty({1, 2}, DType::kF32);
  EXPECT_EQ(group->AllReduceSum(0, x, small).code(),
            absl::StatusCode::kInvalidArgument);
  // Three rows do not split over two ranks.
  EXPECT_THAT(group->ReduceScatterRows(0, x, small).message(),
              HasSubstr("does not split"));
  EXPECT_EQ(CreateHostTensorParallelGroup(0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RankThreadsTest, CarriesTheCallersCancellation) {
  Cancellation cancellation;
  cancellation.Cancel(absl::CancelledError("job cancelled"));
  const CancellationScope scope(&cancellation);
  RankThreads threads(2);
  std::vector<const Cancellation*> seen(2);
  ASSERT_TRUE(threads
                  .Run(
                      [&](int r) {
                        seen[r] = CurrentCancellation();
                        return absl::OkStatus();
                      },
                      [](const absl::Status&) {})
                  .ok());
  EXPECT_EQ(seen[0], &cancellation);
  EXPECT_EQ(seen[1], &cancellation);
}

}  // namespace
}  // namespace conveyor::engine
