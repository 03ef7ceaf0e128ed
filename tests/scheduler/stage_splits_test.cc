#include "scheduler/internal/stage_splits.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/partitioner.h"

namespace conveyor::scheduler::stage_search_internal {
namespace {

using ::testing::ElementsAre;

TEST(CappedBinomialTest, CountsAndCaps) {
  EXPECT_EQ(CappedBinomial(5, 2, 1000), 10);
  EXPECT_EQ(CappedBinomial(5, 0, 1000), 1);
  EXPECT_EQ(CappedBinomial(5, 6, 1000), 0);
  EXPECT_EQ(CappedBinomial(5, 2, 7), 7);
  // C(200, 100) overflows int64: the cap, not garbage.
  EXPECT_EQ(CappedBinomial(200, 100, 1'000'000), 1'000'000);
}

TEST(SplitEnumeratorTest, ListsEverySplitInLexicographicOrder) {
  const std::vector<int> fixed;
  SplitEnumerator splits(/*layers=*/4, /*stages=*/3, fixed);
  EXPECT_EQ(splits.Count(100), 3);
  std::vector<std::vector<int>> all;
  for (std::vector<int> split; splits.Next(&split);) all.push_back(split);
  EXPECT_THAT(all, ElementsAre(ElementsAre(0, 1, 2), ElementsAre(0, 1, 3),
                               ElementsAre(0, 2, 3)));
}

TEST(SplitEnumeratorTest, EverySplitKeepsTheFixedBoundaries) {
  const std::vector<int> fixed = {2};
  SplitEnumerator splits(/*layers=*/5, /*stages=*/3, fixed);
  EXPECT_EQ(splits.Count(100), 3);  // The free boundary: 1, 3 or 4.
  std::vector<std::vector<int>> all;
  for (std::vector<int> split; splits.Next(&split);) all.push_back(split);
  EXPECT_THAT(all, ElementsAre(ElementsAre(0, 1, 2), ElementsAre(0, 2, 3),
                               ElementsAre(0, 2, 4)));
}

TEST(UniformSplitTest, FirstStagesTakeTheRemainder) {
  EXPECT_THAT(UniformSplit(7, 3), ElementsAre(0, 3, 5));
}

TEST(SeedSplitTest, WithoutFixedBoundariesIsThePartitioners) {
  const std::vector<double> costs = {1, 5, 1, 1, 1, 3, 2};
  PartitionInput part;
  part.costs = costs;
  part.num_stages = 3;
  EXPECT_EQ(SeedSplit(costs, {}, 3, /*uniform=*/false).value(),
            PartitionLayers(part).value().stage_begin);
  EXPECT_EQ(SeedSplit(costs, {}, 3, /*uniform=*/true).value(),
            PartitionUniform(part).value().stage_begin);
}

TEST(SeedSplitTest, BeginsAStageAtEveryFixedBoundary) {
  // The costly first segment [0, 4) gets two stages, [4, 6) one.
  const std::vector<double> costs = {4, 4, 4, 4, 1, 1};
  const std::vector<int> fixed = {4};
  EXPECT_THAT(SeedSplit(costs, fixed, 3, /*uniform=*/false).value(),
              ElementsAre(0, 2, 4));
}

}  // namespace
}  // namespace conveyor::scheduler::stage_search_internal
