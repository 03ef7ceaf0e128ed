#include "scheduler/stage_search.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/partitioner.h"

namespace conveyor::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Calls `visit(stage_begin)` for every split of `layers` layers into `stages`
// contiguous non-empty stages.
void ForEachSplit(int layers, int stages,
                  const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> begin = {0};
  std::function<void()> extend = [&] {
    const int placed = static_cast<int>(begin.size());
    if (placed == stages) {
      visit(begin);
      return;
    }
    for (int b = begin.back() + 1; b <= layers - (stages - placed); ++b) {
      begin.push_back(b);
      extend();
      begin.pop_back();
    }
  };
  extend();
}

bool HasAll(const std::vector<int>& stage_begin,
            const std::vector<int>& fixed) {
  for (int b : fixed) {
    if (std::find(stage_begin.begin(), stage_begin.end(), b) ==
        stage_begin.end()) {
      return false;
    }
  }
  return true;
}

double Peak(const StageSearchResult& r) {
  return *std::max_element(r.rank_memory.begin(), r.rank_memory.end());
}

bool Fits(const StageSearchInput& in, const StageSearchResult& r) {
  return !in.memory_budget || Peak(r) <= *in.memory_budget;
}

// The header's optimum, computed independently through EvaluateSplit: the
// smallest makespan among splits that keep the fixed boundaries and fit the
// budget, ties within a relative 1e-12 to the lexicographically largest
// stage_begin.
struct BruteForce {
  std::optional<StageSearchResult> best;
  double smallest_peak = std::numeric_limits<double>::infinity();
  int64_t splits = 0;
};

BruteForce Optimum(const StageSearchInput& in) {
  const int stages = in.ranks * in.virtual_stages;
  std::vector<StageSearchResult> fitting;
  BruteForce out;
  ForEachSplit(static_cast<int>(in.layers.size()), stages,
               [&](const std::vector<int>& split) {
                 if (!HasAll(split, in.fixed_boundaries)) return;
                 ++out.splits;
                 absl::StatusOr<StageSearchResult> r = EvaluateSplit(in, split);
                 ASSERT_TRUE(r.ok()) << r.status();
                 out.smallest_peak = std::min(out.smallest_peak, Peak(*r));
                 if (Fits(in, *r)) fitting.push_back(*std::move(r));
               });
  if (fitting.empty()) return out;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& r : fitting) best = std::min(best, r.makespan);
  for (auto& r : fitting) {
    if (r.makespan <= best + 1e-12 * best &&
        (!out.best || r.stage_begin > out.best->stage_begin)) {
      out.best = r;
    }
  }
  return out;
}

std::string Describe(const StageSearchInput& in) {
  std::string s =
      absl::StrCat(ScheduleKindName(in.kind), " P=", in.ranks,
                   " V=", in.virtual_stages, " M=", in.microbatches,
                   " latency=", in.latency, " layers (F,BI,BW,A,W):");
  for (const LayerCosts& c : in.layers) {
    absl::StrAppend(&s, " (", c.forward, ",", c.backward_input, ",",
                    c.backward_weight, ",", c.activation_bytes, ",",
                    c.state_bytes, ")");
  }
  if (!in.fixed_boundaries.empty()) {
    absl::StrAppend(&s, " fixed=", absl::StrJoin(in.fixed_boundaries, ","));
  }
  if (in.memory_budget) absl::StrAppend(&s, " budget=", *in.memory_budget);
  return s;
}

// A random small instance. Integer costs (1..9) make many exact ties, which
// exercises the tie-break; `real` draws continuous costs instead.
StageSearchInput RandomInput(std::mt19937& rng, ScheduleKind kind, bool real) {
  StageSearchInput in;
  in.kind = kind;
  if (kind == ScheduleKind::kInterleaved1F1B) {
    in.ranks = 2;
    in.virtual_stages = 2;
    in.microbatches = 2 * std::uniform_int_distribution<int>(1, 4)(rng);
  } else {
    in.ranks = std::uniform_int_distribution<int>(2, 4)(rng);
    in.microbatches = std::uniform_int_distribution<int>(1, 8)(rng);
  }
  const int stages = in.ranks * in.virtual_stages;
  const int layers =
      std::uniform_int_distribution<int>(std::max(4, stages), 9)(rng);
  std::uniform_int_distribution<int> cost(1, 9);
  std::uniform_real_distribution<double> real_cost(0.1, 10.0);
  auto draw = [&] {
    return real ? real_cost(rng) : static_cast<double>(cost(rng));
  };
  for (int i = 0; i < layers; ++i) {
    in.layers.push_back({.forward = draw(),
                         .backward_input = draw(),
                         .backward_weight = draw(),
                         .activation_bytes = draw(),
                         .state_bytes = draw()});
  }
  if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) {
    in.latency = std::uniform_int_distribution<int>(0, 3)(rng);
  }
  return in;
}

constexpr ScheduleKind kKinds[] = {ScheduleKind::k1F1B, ScheduleKind::kGPipe,
                                   ScheduleKind::kZeroBubbleH1,
                                   ScheduleKind::kInterleaved1F1B};

TEST(StageSearchTest, ExhaustiveMatchesBruteForceOnRandomInstances) {
  std::mt19937 rng(20240601);
  for (ScheduleKind kind : kKinds) {
    for (int trial = 0; trial < 40; ++trial) {
      const StageSearchInput in = RandomInput(rng, kind, trial % 2 == 1);
      SCOPED_TRACE(Describe(in));
      const BruteForce want = Optimum(in);
      ASSERT_TRUE(want.best.has_value());
      absl::StatusOr<StageSearchResult> got = SearchStages(in);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->exhaustive);
      EXPECT_EQ(got->simulations, want.splits);
      EXPECT_DOUBLE_EQ(got->makespan, want.best->makespan);
      EXPECT_EQ(got->stage_begin, want.best->stage_begin);
      EXPECT_EQ(got->rank_memory, want.best->rank_memory);
    }
  }
}

TEST(StageSearchTest, ExhaustiveMatchesBruteForceWithBudgetAndFixedBoundaries) {
  std::mt19937 rng(7);
  int constrained = 0;  // cases where the budget moved the answer
  for (ScheduleKind kind : kKinds) {
    for (int trial = 0; trial < 30; ++trial) {
      StageSearchInput in = RandomInput(rng, kind, trial % 2 == 0);
      const int layers = static_cast<int>(in.layers.size());
      const int stages = in.ranks * in.virtual_stages;
      if (trial % 3 == 0) {
        in.fixed_boundaries = {
            std::uniform_int_distribution<int>(1, layers - 1)(rng)};
      }
      const BruteForce free = Optimum(in);
      ASSERT_TRUE(free.best.has_value());
      // A budget between the smallest peak and the free optimum's peak.
      const double lo = free.smallest_peak, hi = Peak(*free.best);
      in.memory_budget =
          lo + (hi - lo) * std::uniform_real_distribution<double>(0, 1)(rng);
      SCOPED_TRACE(Describe(in));
      const BruteForce want = Optimum(in);
      ASSERT_TRUE(want.best.has_value());
      if (want.best->stage_begin != free.best->stage_begin) ++constrained;
      absl::StatusOr<StageSearchResult> got = SearchStages(in);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->exhaustive);
      EXPECT_DOUBLE_EQ(got->makespan, want.best->makespan);
      EXPECT_EQ(got->stage_begin, want.best->stage_begin);
      EXPECT_LE(Peak(*got), *in.memory_budget);
      EXPECT_TRUE(HasAll(got->stage_begin, in.fixed_boundaries));
      EXPECT_EQ(static_cast<int>(got->stage_begin.size()), stages);
    }
  }
  // The budgets must actually bind in a good share of the cases, or this test
  // checks nothing the unconstrained one does not.
  EXPECT_GE(constrained, 20);
}

// Evaluates the partitioner's min-max split of F + BI + BW.
StageSearchResult MinMaxSplit(const StageSearchInput& in) {
  PartitionInput part;
  for (const LayerCosts& c : in.layers) {
    part.costs.push_back(c.forward + c.backward_input + c.backward_weight);
  }
  part.num_stages = in.ranks * in.virtual_stages;
  absl::StatusOr<Partition> p = PartitionLayers(part);
  EXPECT_TRUE(p.ok()) << p.status();
  absl::StatusOr<StageSearchResult> r = EvaluateSplit(in, p->stage_begin);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

StageSearchResult UniformSplitOf(const StageSearchInput& in) {
  PartitionInput part;
  part.costs.assign(in.layers.size(), 1.0);
  part.num_stages = in.ranks * in.virtual_stages;
  absl::StatusOr<Partition> p = PartitionUniform(part);
  EXPECT_TRUE(p.ok()) << p.status();
  absl::StatusOr<StageSearchResult> r = EvaluateSplit(in, p->stage_begin);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

// Layers whose forward is `forward[i]` and whose backward splits as BI = F,
// BW = F (B = 2F), with no memory.
std::vector<LayerCosts> Layers(const std::vector<double>& forward) {
  std::vector<LayerCosts> layers;
  for (double f : forward) {
    layers.push_back({.forward = f, .backward_input = f, .backward_weight = f});
  }
  return layers;
}

TEST(StageSearchTest, LocalSearchIsNeverWorseThanItsSeeds) {
  std::mt19937 rng(99);
  for (ScheduleKind kind : kKinds) {
    for (int trial = 0; trial < 25; ++trial) {
      StageSearchInput in = RandomInput(rng, kind, trial % 2 == 0);
      // Longer models than the brute-force tests, where the seeds matter.
      const int extra = std::uniform_int_distribution<int>(0, 20)(rng);
      for (int i = 0; i < extra; ++i) {
        in.layers.push_back(
            {.forward = std::uniform_real_distribution<double>(0.5, 5)(rng),
             .backward_input = 1,
             .backward_weight = 1});
      }
      in.exhaustive_limit = 0;
      SCOPED_TRACE(Describe(in));
      absl::StatusOr<StageSearchResult> got = SearchStages(in);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_FALSE(got->exhaustive);
      EXPECT_GT(got->simulations, 0);
      const double tie = 1 + 1e-12;
      EXPECT_LE(got->makespan, MinMaxSplit(in).makespan * tie);
      EXPECT_LE(got->makespan, UniformSplitOf(in).makespan * tie);
      ASSERT_TRUE(got->even_makespan.has_value());
      EXPECT_LE(got->makespan, *got->even_makespan * tie);
    }
  }
}

// How often local search alone finds the brute-force optimum. Measured with
// this seed: 190 of 200 (95%), where the better seed alone is optimal in
// 155. The bound leaves room for a changed tie-break but catches a search that
// stops at the seeds.
TEST(StageSearchTest, LocalSearchUsuallyFindsTheOptimum) {
  std::mt19937 rng(1);
  int hits = 0, total = 0, seeds_optimal = 0;
  for (ScheduleKind kind : kKinds) {
    for (int trial = 0; trial < 50; ++trial) {
      StageSearchInput in = RandomInput(rng, kind, trial % 2 == 0);
      in.exhaustive_limit = 0;
      absl::StatusOr<StageSearchResult> got = SearchStages(in);
      ASSERT_TRUE(got.ok()) << got.status();
      const BruteForce want = Optimum(in);
      ASSERT_TRUE(want.best.has_value());
      const double optimum = want.best->makespan * (1 + 1e-12);
      ++total;
      hits += got->makespan <= optimum;
      seeds_optimal += std::min(MinMaxSplit(in).makespan,
                                UniformSplitOf(in).makespan) <= optimum;
    }
  }
  RecordProperty("local_search_hits", hits);
  RecordProperty("seed_hits", seeds_optimal);
  EXPECT_EQ(total, 200);
  EXPECT_GE(hits, 180) << "seeds alone were optimal in " << seeds_optimal;
  EXPECT_GT(hits, seeds_optimal);
}

// 1F1B, P = 2, M = 2, with F = BI and no BW: layers 4, 3, 2, 1. The min-max
// split {4 | 3, 2, 1} (slowest stage 6) runs 32; {4, 3 | 2, 1} (slowest
// stage 7) runs 28 because the light last stage returns the first gradient
// soon and the heavy first stage's second forward overlaps it:
//   rank 0: F0 [0,7] F1 [7,14] B0 [14,21] B1 [21,28]
//   rank 1: F0 [7,10] B0 [10,13] F1 [14,17] B1 [17,20]
StageSearchInput HeavyFirstLayers() {
  StageSearchInput in;
  for (double f : {4.0, 3.0, 2.0, 1.0}) {
    in.layers.push_back({.forward = f, .backward_input = f});
  }
  in.kind = ScheduleKind::k1F1B;
  in.ranks = 2;
  in.microbatches = 2;
  return in;
}

TEST(StageSearchTest, BeatsTheMinMaxPartitionWhereMakespanDiffers) {
  const StageSearchInput in = HeavyFirstLayers();
  const StageSearchResult min_max = MinMaxSplit(in);
  EXPECT_THAT(min_max.stage_begin, ElementsAre(0, 1));
  EXPECT_DOUBLE_EQ(min_max.makespan, 32);
  absl::StatusOr<StageSearchResult> got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->exhaustive);
  EXPECT_THAT(got->stage_begin, ElementsAre(0, 2));
  EXPECT_DOUBLE_EQ(got->makespan, 28);
  EXPECT_THAT(got->stage_time, ElementsAre(14, 6));
  EXPECT_LT(got->makespan, min_max.makespan);
}

TEST(StageSearchTest, LocalSearchFindsTheOptimumOnAHandMadeCase) {
  StageSearchInput in = HeavyFirstLayers();
  in.exhaustive_limit = 0;
  absl::StatusOr<StageSearchResult> got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->exhaustive);
  EXPECT_THAT(got->stage_begin, ElementsAre(0, 2));
  EXPECT_DOUBLE_EQ(got->makespan, 28);
}

TEST(StageSearchTest, UnevenModelBeatsTheEvenSplit) {
  StageSearchInput in;
  in.layers = Layers({1, 1, 1, 1, 1, 1, 4, 4});
  in.kind = ScheduleKind::k1F1B;
  in.ranks = 4;
  in.microbatches = 8;
  for (int64_t limit : {int64_t{20000}, int64_t{0}}) {
    in.exhaustive_limit = limit;
    SCOPED_TRACE(absl::StrCat("exhaustive_limit = ", limit));
    absl::StatusOr<StageSearchResult> got = SearchStages(in);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(got->even_stage_begin, ElementsAre(0, 2, 4, 6));
    ASSERT_TRUE(got->even_makespan.has_value());
    // Even: stage 3 holds both heavy layers (F = 8, B = 16), and every
    // microbatch waits on it: 3 forwards of 2 to reach it, M * 24 on it, and
    // 3 backwards of 4 to drain, 6 + 192 + 12 = 210. Searched: {0, 4, 6, 7},
    // the heavy layers on stages of their own (F = 4, 2, 4, 4), 126.
    EXPECT_DOUBLE_EQ(*got->even_makespan, 210);
    EXPECT_DOUBLE_EQ(got->makespan, 126);
    const double ratio = got->makespan / *got->even_makespan;
    EXPECT_LE(ratio, 0.8) << "makespan " << got->makespan;
    EXPECT_THAT(got->stage_begin, ElementsAre(0, 4, 6, 7));
  }
}

TEST(StageSearchTest, ZeroBubbleUsesTheBackwardSplit) {
  // Same F and B = BI + BW for both kinds; zb-h1 defers BW into the bubble,
  // so where BW sits changes which split is best.
  StageSearchInput in;
  in.layers = {{.forward = 1, .backward_input = 4, .backward_weight = 0},
               {.forward = 1, .backward_input = 2, .backward_weight = 1},
               {.forward = 1, .backward_input = 1, .backward_weight = 3},
               {.forward = 1, .backward_input = 4, .backward_weight = 3}};
  in.ranks = 2;
  in.microbatches = 2;
  in.kind = ScheduleKind::k1F1B;
  absl::StatusOr<StageSearchResult> one_f_one_b = SearchStages(in);
  ASSERT_TRUE(one_f_one_b.ok()) << one_f_one_b.status();
  in.kind = ScheduleKind::kZeroBubbleH1;
  absl::StatusOr<StageSearchResult> zero_bubble = SearchStages(in);
  ASSERT_TRUE(zero_bubble.ok()) << zero_bubble.status();
  EXPECT_THAT(one_f_one_b->stage_begin, ElementsAre(0, 3));
  EXPECT_THAT(zero_bubble->stage_begin, ElementsAre(0, 2));
  absl::StatusOr<StageSearchResult> zb_on_1f1b_split =
      EvaluateSplit(in, one_f_one_b->stage_begin);
  ASSERT_TRUE(zb_on_1f1b_split.ok());
  EXPECT_LT(zero_bubble->makespan, zb_on_1f1b_split->makespan);
}

// Two ranks of 1F1B: rank 0 holds P = 2 microbatches' activations, rank 1
// one. Activation-heavy early layers make the time-optimal split too big for
// rank 0. Splits (second stage's first layer: makespan, peak rank memory):
//   1: 74, 370   2: 68, 440   3: 62, 660   4: 56, 780   5: 56, 820
StageSearchInput ActivationHeavyModel() {
  StageSearchInput in;
  const double forward[] = {1, 1, 1, 1, 3, 3};
  const double activation[] = {100, 100, 100, 50, 10, 10};
  for (int i = 0; i < 6; ++i) {
    in.layers.push_back({.forward = forward[i],
                         .backward_input = forward[i],
                         .backward_weight = 0,
                         .activation_bytes = activation[i],
                         .state_bytes = 20});
  }
  in.kind = ScheduleKind::k1F1B;
  in.ranks = 2;
  in.microbatches = 4;
  return in;
}

TEST(StageSearchTest, MemoryBudgetPicksTheBestSplitThatFits) {
  StageSearchInput in = ActivationHeavyModel();
  absl::StatusOr<StageSearchResult> free = SearchStages(in);
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_THAT(free->stage_begin, ElementsAre(0, 5));
  EXPECT_DOUBLE_EQ(free->makespan, 56);
  // Both 56-splits break the budget; the best that fits is {0, 3}.
  in.memory_budget = 700;
  EXPECT_GT(Peak(*free), *in.memory_budget);
  const BruteForce want = Optimum(in);
  ASSERT_TRUE(want.best.has_value());
  EXPECT_THAT(want.best->stage_begin, ElementsAre(0, 3));
  for (int64_t limit : {int64_t{20000}, int64_t{0}}) {
    in.exhaustive_limit = limit;
    SCOPED_TRACE(absl::StrCat("exhaustive_limit = ", limit));
    absl::StatusOr<StageSearchResult> got = SearchStages(in);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NE(got->stage_begin, free->stage_begin);
    EXPECT_LE(Peak(*got), *in.memory_budget);
    EXPECT_EQ(got->stage_begin, want.best->stage_begin);
    EXPECT_DOUBLE_EQ(got->makespan, want.best->makespan);
    EXPECT_GT(got->makespan, free->makespan);
  }
}

TEST(StageSearchTest, ImpossibleBudgetReportsTheSmallestPeak) {
  StageSearchInput in = ActivationHeavyModel();
  const BruteForce all = Optimum(in);
  in.memory_budget = all.smallest_peak - 1;
  for (int64_t limit : {int64_t{20000}, int64_t{0}}) {
    in.exhaustive_limit = limit;
    SCOPED_TRACE(absl::StrCat("exhaustive_limit = ", limit));
    absl::StatusOr<StageSearchResult> got = SearchStages(in);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(), HasSubstr("memory_budget"));
    // Local search drives the amount over budget down first, so here it
    // reaches the true smallest peak too.
    EXPECT_THAT(got.status().message(),
                HasSubstr(absl::StrCat("the smallest peak any examined split "
                                       "needs is ",
                                       all.smallest_peak, " bytes")));
  }
  // Exactly the smallest peak fits.
  in.memory_budget = all.smallest_peak;
  in.exhaustive_limit = 20000;
  absl::StatusOr<StageSearchResult> got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_DOUBLE_EQ(Peak(*got), all.smallest_peak);
}

TEST(StageSearchTest, EvenMakespanIsUnsetWhenTheEvenSplitBreaksAConstraint) {
  StageSearchInput in = ActivationHeavyModel();
  absl::StatusOr<StageSearchResult> got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->even_stage_begin, ElementsAre(0, 3));
  EXPECT_TRUE(got->even_makespan.has_value());

  in.fixed_boundaries = {2};
  got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->stage_begin, ElementsAre(0, 2));
  EXPECT_FALSE(got->even_makespan.has_value());

  in.fixed_boundaries = {};
  absl::StatusOr<StageSearchResult> even = EvaluateSplit(in, {0, 3});
  ASSERT_TRUE(even.ok()) << even.status();
  in.memory_budget = Peak(*even) - 1;
  got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->even_makespan.has_value());
}

TEST(StageSearchTest, FixedBoundariesAreHonored) {
  std::mt19937 rng(5);
  for (ScheduleKind kind : kKinds) {
    for (int trial = 0; trial < 10; ++trial) {
      StageSearchInput in = RandomInput(rng, kind, true);
      const int extra = std::uniform_int_distribution<int>(0, 15)(rng);
      for (int i = 0; i < extra; ++i) in.layers.push_back(in.layers[i % 4]);
      const int layers = static_cast<int>(in.layers.size());
      const int stages = in.ranks * in.virtual_stages;
      // 1..S-1 distinct boundaries.
      std::vector<int> positions(layers - 1);
      for (int i = 0; i < layers - 1; ++i) positions[i] = i + 1;
      std::shuffle(positions.begin(), positions.end(), rng);
      positions.resize(std::uniform_int_distribution<int>(1, stages - 1)(rng));
      std::sort(positions.begin(), positions.end());
      in.fixed_boundaries = positions;
      for (int64_t limit : {int64_t{20000}, int64_t{0}}) {
        in.exhaustive_limit = limit;
        SCOPED_TRACE(absl::StrCat(Describe(in), " limit=", limit));
        absl::StatusOr<StageSearchResult> got = SearchStages(in);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->exhaustive, limit > 0);
        EXPECT_EQ(static_cast<int>(got->stage_begin.size()), stages);
        EXPECT_TRUE(HasAll(got->stage_begin, in.fixed_boundaries))
            << absl::StrJoin(got->stage_begin, ",");
        EXPECT_TRUE(
            std::is_sorted(got->stage_begin.begin(), got->stage_begin.end()) &&
            std::adjacent_find(got->stage_begin.begin(),
                               got->stage_begin.end()) ==
                got->stage_begin.end());
      }
    }
  }
}

TEST(StageSearchTest, AllBoundariesFixedLeavesOneSplit) {
  StageSearchInput in;
  in.layers = Layers({1, 2, 3, 4, 5, 6});
  in.ranks = 3;
  in.microbatches = 3;
  in.fixed_boundaries = {1, 5};
  absl::StatusOr<StageSearchResult> got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->exhaustive);
  EXPECT_EQ(got->simulations, 1);
  EXPECT_THAT(got->stage_begin, ElementsAre(0, 1, 5));
  in.exhaustive_limit = 0;
  got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->exhaustive);
  EXPECT_THAT(got->stage_begin, ElementsAre(0, 1, 5));
}

TEST(StageSearchTest, BadFixedBoundariesAreInvalidArgument) {
  StageSearchInput in;
  in.layers = Layers({1, 1, 1, 1, 1, 1});
  in.ranks = 3;
  for (const std::vector<int>& fixed : std::vector<std::vector<int>>{
           {0}, {6}, {-1}, {3, 2}, {2, 2}, {1, 2, 3}}) {
    in.fixed_boundaries = fixed;
    SCOPED_TRACE(absl::StrJoin(fixed, ","));
    absl::StatusOr<StageSearchResult> got = SearchStages(in);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(), HasSubstr("fixed_boundaries"));
    EXPECT_EQ(EvaluateSplit(in, {0, 2, 4}).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(StageSearchTest, CountsSplitsToChooseExhaustiveSearch) {
  StageSearchInput in;
  in.layers = Layers({1, 2, 3, 4, 5, 4, 3, 2, 1});
  in.ranks = 4;
  in.microbatches = 4;
  // C(8, 3) = 56 splits.
  in.exhaustive_limit = 56;
  absl::StatusOr<StageSearchResult> got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->exhaustive);
  EXPECT_EQ(got->simulations, 56);
  in.exhaustive_limit = 55;
  got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->exhaustive);
  // With boundary 4 fixed: C(7, 2) = 21.
  in.fixed_boundaries = {4};
  in.exhaustive_limit = 21;
  got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->exhaustive);
  EXPECT_EQ(got->simulations, 21);
}

TEST(StageSearchTest, HugeSplitCountsDoNotOverflow) {
  // C(119, 59) is about 1e34; the count is capped, not wrapped, so even the
  // largest limit below it means local search.
  StageSearchInput in;
  in.layers = Layers(std::vector<double>(120, 1.0));
  in.ranks = 60;
  in.microbatches = 2;
  in.exhaustive_limit = std::numeric_limits<int64_t>::max() - 1;
  absl::StatusOr<StageSearchResult> got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->exhaustive);
  EXPECT_GT(got->simulations, 0);
  ASSERT_TRUE(got->even_makespan.has_value());
  EXPECT_LE(got->makespan, *got->even_makespan);
}

TEST(StageSearchTest, EvaluateSplitReportsTimeAndMemory) {
  StageSearchInput in;
  for (int i = 0; i < 3; ++i) {
    in.layers.push_back({.forward = 1,
                         .backward_input = 2,
                         .backward_weight = 3,
                         .activation_bytes = 10,
                         .state_bytes = 100});
  }
  in.ranks = 2;
  in.microbatches = 2;
  absl::StatusOr<StageSearchResult> got = EvaluateSplit(in, {0, 2});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->exhaustive);
  EXPECT_EQ(got->simulations, 1);
  EXPECT_THAT(got->stage_time, ElementsAre(12, 6));
  // 1F1B with P = M = 2: rank 0 holds two microbatches, rank 1 one.
  EXPECT_THAT(got->stage_memory, ElementsAre(200 + 20 * 2, 100 + 10 * 1));
  EXPECT_THAT(got->rank_memory, ElementsAre(240, 110));
  EXPECT_THAT(got->even_stage_begin, ElementsAre(0, 2));
  ASSERT_TRUE(got->even_makespan.has_value());
  EXPECT_DOUBLE_EQ(*got->even_makespan, got->makespan);
  // Rank 0: F0 [0,2] F1 [2,4]; rank 1: F0 [2,3] B0 [3,8] F1 [8,9] B1 [9,14];
  // rank 0: B0 [8,18] B1 [18,28].
  EXPECT_DOUBLE_EQ(got->makespan, 28);
  EXPECT_GT(got->bubble_fraction, 0);
  EXPECT_LT(got->bubble_fraction, 1);
}

TEST(StageSearchTest, InterleavedChargesEveryStageItsRanksPeak) {
  StageSearchInput in;
  for (int i = 0; i < 8; ++i) {
    in.layers.push_back({.forward = 1,
                         .backward_input = 1,
                         .backward_weight = 1,
                         .activation_bytes = 1,
                         .state_bytes = 0});
  }
  in.kind = ScheduleKind::kInterleaved1F1B;
  in.ranks = 2;
  in.virtual_stages = 2;
  in.microbatches = 4;
  absl::StatusOr<StageSearchResult> got = EvaluateSplit(in, {0, 2, 4, 6});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->stage_memory.size(), 4u);
  ASSERT_EQ(got->rank_memory.size(), 2u);
  // Stages 0 and 2 on rank 0, 1 and 3 on rank 1, each charged its rank's
  // peak times two layers of one byte.
  EXPECT_DOUBLE_EQ(got->stage_memory[0], got->stage_memory[2]);
  EXPECT_DOUBLE_EQ(got->stage_memory[1], got->stage_memory[3]);
  EXPECT_DOUBLE_EQ(got->rank_memory[0],
                   got->stage_memory[0] + got->stage_memory[2]);
  EXPECT_DOUBLE_EQ(got->rank_memory[1],
                   got->stage_memory[1] + got->stage_memory[3]);
  EXPECT_GE(got->rank_memory[0], got->rank_memory[1]);
}

TEST(StageSearchTest, EvaluateSplitRejectsMalformedSplits) {
  StageSearchInput in;
  in.layers = Layers({1, 1, 1, 1});
  in.ranks = 2;
  for (const std::vector<int>& split : std::vector<std::vector<int>>{
           {}, {0}, {0, 1, 2}, {1, 2}, {0, 0}, {0, 4}, {0, -1}}) {
    SCOPED_TRACE(absl::StrJoin(split, ","));
    absl::StatusOr<StageSearchResult> got = EvaluateSplit(in, split);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(), HasSubstr("stage_begin"));
  }
}

struct BadInput {
  std::string name;
  std::function<void(StageSearchInput&)> edit;
  std::string message;  // a substring the error must contain
};

TEST(StageSearchTest, InvalidInputIsInvalidArgument) {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  constexpr double inf = std::numeric_limits<double>::infinity();
  const std::vector<BadInput> cases = {
      {"empty", [](StageSearchInput& in) { in.layers.clear(); }, "layers"},
      {"too many layers",
       [](StageSearchInput& in) {
         in.layers.resize(kMaxPartitionLayers + 1, in.layers[0]);
       },
       "at most"},
      {"negative forward",
       [](StageSearchInput& in) { in.layers[1].forward = -1; },
       "layers[1].forward"},
      {"nan backward_weight",
       [](StageSearchInput& in) { in.layers[2].backward_weight = nan; },
       "layers[2].backward_weight"},
      {"infinite activation",
       [](StageSearchInput& in) { in.layers[0].activation_bytes = inf; },
       "layers[0].activation_bytes"},
      {"negative state",
       [](StageSearchInput& in) { in.layers[3].state_bytes = -5; },
       "layers[3].state_bytes"},
      {"sum overflows",
       [](StageSearchInput& in) {
         for (auto& l : in.layers) l.forward = 1e308;
       },
       "overflows"},
      {"fewer layers than stages", [](StageSearchInput& in) { in.ranks = 5; },
       "at least one layer"},
      {"zero ranks", [](StageSearchInput& in) { in.ranks = 0; }, "ranks"},
      {"zero microbatches", [](StageSearchInput& in) { in.microbatches = 0; },
       "microbatches"},
      {"interleaved M not multiple of P",
       [](StageSearchInput& in) {
         in.kind = ScheduleKind::kInterleaved1F1B;
         in.virtual_stages = 2;
         in.microbatches = 3;
       },
       "multiple of ranks"},
      {"1f1b with V > 1", [](StageSearchInput& in) { in.virtual_stages = 2; },
       "V = 1"},
      {"negative latency", [](StageSearchInput& in) { in.latency = -1; },
       "latency"},
      {"nan latency", [](StageSearchInput& in) { in.latency = nan; },
       "latency"},
      {"negative budget", [](StageSearchInput& in) { in.memory_budget = -1; },
       "memory_budget"},
      {"nan budget",
       [](StageSearchInput& in) { in.memory_budget = double{nan}; },
       "memory_budget"},
      {"negative exhaustive_limit",
       [](StageSearchInput& in) { in.exhaustive_limit = -1; },
       "exhaustive_limit"},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.name);
    StageSearchInput in;
    in.layers = Layers({1, 2, 3, 4});
    in.ranks = 2;
    in.microbatches = 4;
    c.edit(in);
    absl::StatusOr<StageSearchResult> got = SearchStages(in);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(), HasSubstr(c.message));
    absl::StatusOr<StageSearchResult> eval = EvaluateSplit(in, {0, 2});
    EXPECT_EQ(eval.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(StageSearchTest, LargeModelLocalSearchFinishes) {
  std::mt19937 rng(64);
  StageSearchInput in;
  std::uniform_real_distribution<double> cost(0.5, 2.0);
  for (int i = 0; i < 64; ++i) {
    const double f = cost(rng);
    in.layers.push_back({.forward = f,
                         .backward_input = f,
                         .backward_weight = f * cost(rng) / 2,
                         .activation_bytes = 1e6,
                         .state_bytes = 1e7});
  }
  in.kind = ScheduleKind::k1F1B;
  in.ranks = 8;
  in.microbatches = 16;
  absl::StatusOr<StageSearchResult> got = SearchStages(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->exhaustive);  // C(63, 7) is far past the default limit
  EXPECT_GT(got->simulations, 0);
  EXPECT_EQ(got->stage_begin.size(), 8u);
  EXPECT_LE(got->makespan, MinMaxSplit(in).makespan * (1 + 1e-12));
  ASSERT_TRUE(got->even_makespan.has_value());
  EXPECT_LE(got->makespan, *got->even_makespan * (1 + 1e-12));

  // A work budget of 10 simulations (of 8 x 16 x 2 actions): the two seeds
  // and at most 10 moves in all, still no worse than the seeds. The same
  // budget makes a small enumeration local rather than exhaustive.
  in.max_simulated_actions = 10 * 8 * 16 * 2;
  absl::StatusOr<StageSearchResult> bounded = SearchStages(in);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_LE(bounded->simulations, 10 + 2);
  EXPECT_LE(bounded->makespan, MinMaxSplit(in).makespan * (1 + 1e-12));
  EXPECT_GE(bounded->makespan, got->makespan * (1 - 1e-12));
  in.layers.resize(10);
  in.exhaustive_limit = 1000;  // C(9, 7) = 36 splits, but 10 allowed
  absl::StatusOr<StageSearchResult> small = SearchStages(in);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE(small->exhaustive);
  in.max_simulated_actions = 0;
  EXPECT_EQ(SearchStages(in).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor::scheduler
