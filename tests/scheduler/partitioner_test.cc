#include "scheduler/partitioner.h"

#include <algorithm>
#include <cmath>
#include <compare>
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

namespace conveyor::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kNoSplit = std::numeric_limits<int64_t>::max();

// What a split scores, as the header defines the balanced optimum: the max
// stage cost, then the sum of squared stage costs, then (on the caller's side)
// the lexicographically largest stage_begin.
struct IntKey {
  int64_t max_cost = kNoSplit;
  int64_t sum_squares = kNoSplit;
  auto operator<=>(const IntKey&) const = default;
};

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
    // Leave at least one layer for each stage still to place.
    for (int b = begin.back() + 1; b <= layers - (stages - placed); ++b) {
      begin.push_back(b);
      extend();
      begin.pop_back();
    }
  };
  extend();
}

int64_t Sum(const std::vector<int64_t>& v, int begin, int end) {
  int64_t sum = 0;
  for (int i = begin; i < end; ++i) sum += v[i];
  return sum;
}

int StageEndOf(const std::vector<int>& begin, int s, int layers) {
  return s + 1 < static_cast<int>(begin.size()) ? begin[s + 1] : layers;
}

struct IntCase {
  std::vector<int64_t> costs;
  std::vector<int64_t> memory;  // empty: none
  std::optional<int64_t> cap;
  int stages = 1;

  PartitionInput Input() const {
    PartitionInput in;
    in.costs.assign(costs.begin(), costs.end());
    in.memory.assign(memory.begin(), memory.end());
    if (cap) in.memory_cap = static_cast<double>(*cap);
    in.num_stages = stages;
    return in;
  }
  std::string DebugString() const {
    return absl::StrCat("costs={", absl::StrJoin(costs, ","), "} memory={",
                        absl::StrJoin(memory, ","),
                        "} cap=", cap ? absl::StrCat(*cap) : "none",
                        " S=", stages);
  }
};

struct BruteResult {
  std::vector<int> stage_begin;  // empty: no split fits the cap
  IntKey key;
  int64_t min_max_memory = kNoSplit;  // over all splits, cap ignored
};

// Tries every split, in exact integer arithmetic.
BruteResult BruteForce(const IntCase& c) {
  const int layers = static_cast<int>(c.costs.size());
  BruteResult best;
  ForEachSplit(layers, c.stages, [&](const std::vector<int>& begin) {
    IntKey key{0, 0};
    int64_t max_memory = 0;
    for (int s = 0; s < c.stages; ++s) {
      const int end = StageEndOf(begin, s, layers);
      const int64_t cost = Sum(c.costs, begin[s], end);
      key.max_cost = std::max(key.max_cost, cost);
      key.sum_squares += cost * cost;
      if (!c.memory.empty()) {
        max_memory = std::max(max_memory, Sum(c.memory, begin[s], end));
      }
    }
    best.min_max_memory = std::min(best.min_max_memory, max_memory);
    if (c.cap && max_memory > *c.cap) return;
    if (key < best.key || (key == best.key && begin > best.stage_begin)) {
      best.key = key;
      best.stage_begin = begin;
    }
  });
  return best;
}

// An independent O(S L^2) dynamic program for the same three-level optimum,
// for inputs too large to enumerate: min-max first, then least sum of
// squares under that bound with the rightmost (longest-first) tie-break.
std::vector<int> ReferenceDp(const IntCase& c) {
  const int layers = static_cast<int>(c.costs.size());
  auto sum = [&](const std::vector<int64_t>& v, int i, int j) {
    return Sum(v, i, j);
  };
  auto fits_memory = [&](int i, int j) {
    return !c.cap || sum(c.memory, i, j) <= *c.cap;
  };
  // best[k][j]: min-max cost of layers [0, j) in k stages.
  std::vector<std::vector<int64_t>> best(
      c.stages + 1, std::vector<int64_t>(layers + 1, kNoSplit));
  best[0][0] = 0;
  for (int k = 1; k <= c.stages; ++k) {
    for (int j = 1; j <= layers; ++j) {
      for (int i = 0; i < j; ++i) {
        if (best[k - 1][i] == kNoSplit || !fits_memory(i, j)) continue;
        best[k][j] =
            std::min(best[k][j], std::max(best[k - 1][i], sum(c.costs, i, j)));
      }
    }
  }
  const int64_t bound = best[c.stages][layers];
  if (bound == kNoSplit) return {};
  // g[r][i]: least sum of squares of layers [i, L) in r stages within bound.
  std::vector<std::vector<int64_t>> g(
      c.stages + 1, std::vector<int64_t>(layers + 1, kNoSplit));
  std::vector<std::vector<int>> next(c.stages + 1,
                                     std::vector<int>(layers + 1, -1));
  g[0][layers] = 0;
  for (int r = 1; r <= c.stages; ++r) {
    for (int i = 0; i < layers; ++i) {
      for (int j = i + 1; j <= layers; ++j) {
        const int64_t cost = sum(c.costs, i, j);
        if (g[r - 1][j] == kNoSplit || cost > bound || !fits_memory(i, j)) {
          continue;
        }
        const int64_t v = cost * cost + g[r - 1][j];
        if (v <= g[r][i]) {
          g[r][i] = v;
          next[r][i] = j;
        }
      }
    }
  }
  std::vector<int> begin;
  for (int r = c.stages, i = 0; r >= 1; --r) {
    begin.push_back(i);
    i = next[r][i];
  }
  return begin;
}

// Checks everything a Partition promises about itself against its input.
void ExpectConsistent(const Partition& p, const IntCase& c) {
  const int layers = static_cast<int>(c.costs.size());
  ASSERT_EQ(p.num_layers, layers);
  ASSERT_EQ(p.num_stages(), c.stages);
  ASSERT_EQ(p.stage_cost.size(), static_cast<size_t>(c.stages));
  ASSERT_EQ(p.stage_memory.size(),
            static_cast<size_t>(c.memory.empty() ? 0 : c.stages));
  EXPECT_EQ(p.stage_begin[0], 0);
  int64_t max_cost = 0;
  for (int s = 0; s < c.stages; ++s) {
    ASSERT_LT(p.stage_begin[s], p.StageEnd(s)) << "stage " << s << " empty";
    const int64_t cost = Sum(c.costs, p.stage_begin[s], p.StageEnd(s));
    EXPECT_EQ(p.stage_cost[s], static_cast<double>(cost));
    max_cost = std::max(max_cost, cost);
    if (!c.memory.empty()) {
      const int64_t memory = Sum(c.memory, p.stage_begin[s], p.StageEnd(s));
      EXPECT_EQ(p.stage_memory[s], static_cast<double>(memory));
      if (c.cap) {
        EXPECT_LE(memory, *c.cap);
      }
    }
  }
  EXPECT_EQ(p.StageEnd(c.stages - 1), layers);
  EXPECT_EQ(p.max_stage_cost, static_cast<double>(max_cost));
}

IntCase RandomCase(std::mt19937& rng, int max_layers, int64_t max_value,
                   bool with_memory) {
  IntCase c;
  const int layers = std::uniform_int_distribution<int>(1, max_layers)(rng);
  c.stages = std::uniform_int_distribution<int>(1, layers)(rng);
  std::uniform_int_distribution<int64_t> value(0, max_value);
  // Half of the cases draw many zeros: zero-cost layers make long plateaus of
  // equally good splits, which is where tie-breaking goes wrong.
  const bool sparse = std::bernoulli_distribution(0.5)(rng);
  for (int i = 0; i < layers; ++i) {
    c.costs.push_back(sparse && rng() % 2 ? 0 : value(rng));
  }
  if (with_memory) {
    for (int i = 0; i < layers; ++i) c.memory.push_back(value(rng));
    // Anywhere from below the largest layer (never fits) to the total.
    if (std::bernoulli_distribution(0.8)(rng)) {
      const int64_t total = Sum(c.memory, 0, layers);
      c.cap = std::uniform_int_distribution<int64_t>(0, total)(rng);
    }
  }
  return c;
}

TEST(PartitionerTest, StrategyNamesRoundTrip) {
  for (PartitionStrategy s :
       {PartitionStrategy::kBalanced, PartitionStrategy::kUniform,
        PartitionStrategy::kParameters}) {
    absl::StatusOr<PartitionStrategy> parsed =
        ParsePartitionStrategy(PartitionStrategyName(s));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_EQ(PartitionStrategyName(PartitionStrategy::kBalanced), "balanced");
  EXPECT_EQ(PartitionStrategyName(PartitionStrategy::kUniform), "uniform");
  EXPECT_EQ(PartitionStrategyName(PartitionStrategy::kParameters),
            "parameters");
}

TEST(PartitionerTest, ParseRejectsUnknownNameAndListsAllowedOnes) {
  for (absl::string_view bad : {"greedy", "", "Balanced", "uniform "}) {
    absl::StatusOr<PartitionStrategy> parsed = ParsePartitionStrategy(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        parsed.status().message(),
        HasSubstr(absl::StrCat("unknown partition strategy '", bad, "'")));
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("allowed: balanced, uniform, parameters"));
  }
}

TEST(PartitionerTest, BalancedHandCheckedExample) {
  // 1..9 into 3 stages: the last stage must be {8, 9} = 17 (taking only {9}
  // leaves 36 for two stages, so one has >= 18), and the only way to cut
  // 1..7 into two stages of <= 17 is {1..5} = 15, {6, 7} = 13.
  absl::StatusOr<Partition> p =
      PartitionLayers({.costs = {1, 2, 3, 4, 5, 6, 7, 8, 9}, .num_stages = 3});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 5, 7));
  EXPECT_THAT(p->stage_cost, ElementsAre(15, 13, 17));
  EXPECT_EQ(p->max_stage_cost, 17);
  EXPECT_TRUE(p->stage_memory.empty());
}

TEST(PartitionerTest, BalancedTiesPreferTheMostEvenSplitWithExtraLayersFirst) {
  // Ten equal layers on four stages: every split with stages of at most 3
  // layers is optimal; the most even ones are 3+3+2+2 in some order, and the
  // tie-break puts the extra layers first, as the uniform strategy does.
  absl::StatusOr<Partition> p =
      PartitionLayers({.costs = std::vector<double>(10, 1.0), .num_stages = 4});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 3, 6, 8));
  EXPECT_EQ(p->max_stage_cost, 3);

  // A heavy layer forces the bottleneck; the rest is still split evenly
  // (1 | 10 | 5 | 5) rather than greedily (1 | 10 | 9 | 1).
  p = PartitionLayers(
      {.costs = {1, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, .num_stages = 4});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 1, 2, 7));
  EXPECT_THAT(p->stage_cost, ElementsAre(1, 10, 5, 5));
}

TEST(PartitionerTest, BalancedZeroCostLayersJoinThePrecedingStage) {
  // Parameter counts of linear layers each followed by a parameter-free
  // activation: the activations stay with their linear layer.
  absl::StatusOr<Partition> p =
      PartitionLayers({.costs = {4, 0, 4, 0, 4, 0}, .num_stages = 3});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 2, 4));
  EXPECT_THAT(p->stage_cost, ElementsAre(4, 4, 4));
}

TEST(PartitionerTest, BalancedMemoryCapTradesCostForMemory) {
  const std::vector<double> costs = {1, 1, 1, 1};
  const std::vector<double> memory = {1, 1, 1, 5};
  // Without a cap (or with a loose one) the even split wins.
  for (std::optional<double> cap :
       {std::optional<double>(), std::optional<double>(6.0)}) {
    absl::StatusOr<Partition> p = PartitionLayers(
        {.costs = costs, .memory = memory, .memory_cap = cap, .num_stages = 2});
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_THAT(p->stage_begin, ElementsAre(0, 2));
    EXPECT_THAT(p->stage_memory, ElementsAre(2, 6));
  }
  // At 5 the last layer must stand alone, which costs a slower stage.
  absl::StatusOr<Partition> p = PartitionLayers(
      {.costs = costs, .memory = memory, .memory_cap = 5, .num_stages = 2});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 3));
  EXPECT_THAT(p->stage_cost, ElementsAre(3, 1));
  EXPECT_THAT(p->stage_memory, ElementsAre(3, 5));
  EXPECT_EQ(p->max_stage_cost, 3);
}

TEST(PartitionerTest, InfeasibleMemoryCapReportsTheSmallestCapThatWorks) {
  // Best possible max stage memory on 2 stages: {4} | {4, 1, 1} = 6.
  const PartitionInput input = {.costs = {1, 1, 1, 1},
                                .memory = {4, 4, 1, 1},
                                .memory_cap = 5,
                                .num_stages = 2};
  absl::StatusOr<Partition> p = PartitionLayers(input);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(),
              HasSubstr("no split of 4 layers into 2 stages keeps every "
                        "stage's memory within memory_cap = 5"));
  EXPECT_THAT(p.status().message(),
              HasSubstr("smallest achievable max stage memory is 6"));

  // The reported cap does work.
  PartitionInput relaxed = input;
  relaxed.memory_cap = 6;
  p = PartitionLayers(relaxed);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 1));
}

TEST(PartitionerTest, InfeasibleMemoryCapPrintsByteCountsInFull) {
  // Six significant digits (StrCat's default) would print 2.57698e+10, not a
  // cap anyone can use.
  absl::StatusOr<Partition> p =
      PartitionLayers({.costs = {1, 1},
                       .memory = {12884901888.0, 12884901889.0},
                       .memory_cap = 1e9,
                       .num_stages = 1});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("memory_cap = 1000000000;"));
  EXPECT_THAT(p.status().message(),
              HasSubstr("smallest achievable max stage memory is 25769803777"));
}

TEST(PartitionerTest, IntegerCostsStayExactWhenTheTotalPassesTwoToThe53) {
  if (std::numeric_limits<long double>::digits < 64) {
    GTEST_SKIP() << "long double is too narrow on this platform";
  }
  // Every stage sum is a double, but the running total passes 2^53, where
  // double prefix sums stop counting by one: the {1, 1, 1} stage after the
  // two big layers would come out as 0 or 4 from double prefixes.
  const double big = 4503599627370496.0;  // 2^52
  absl::StatusOr<Partition> p =
      PartitionLayers({.costs = {big, big, 1, 1, 1}, .num_stages = 3});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 1, 2));
  EXPECT_THAT(p->stage_cost, ElementsAre(big, big, 3));
  p = PartitionLayers({.costs = {1, 1, 1, big, big, 1, 1, 1}, .num_stages = 4});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 3, 4, 5));
  EXPECT_THAT(p->stage_cost, ElementsAre(3, big, big, 3));
}

TEST(PartitionerTest, BalancedMatchesBruteForceOnSmallInputs) {
  std::mt19937 rng(20240611);
  int infeasible = 0, with_cap = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const IntCase c = RandomCase(rng, /*max_layers=*/9, /*max_value=*/9,
                                 /*with_memory=*/trial % 2 == 1);
    SCOPED_TRACE(c.DebugString());
    const BruteResult want = BruteForce(c);
    absl::StatusOr<Partition> got = PartitionLayers(c.Input());
    with_cap += c.cap.has_value();
    if (want.stage_begin.empty()) {
      ++infeasible;
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(got.status().message(),
                  HasSubstr(absl::StrCat("smallest achievable max stage "
                                         "memory is ",
                                         want.min_max_memory, ",")));
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectConsistent(*got, c);
    EXPECT_EQ(got->max_stage_cost, static_cast<double>(want.key.max_cost));
    EXPECT_EQ(got->stage_begin, want.stage_begin);
  }
  // The draw must exercise both outcomes of the cap, or the test proves less
  // than it claims.
  EXPECT_GT(infeasible, 100);
  EXPECT_GT(with_cap - infeasible, 300);
}

TEST(PartitionerTest, BalancedMatchesBruteForceOnAllTinyInputs) {
  // Every cost vector over {0, 1, 2} up to 6 layers, every stage count:
  // dense in ties.
  int cases = 0;
  for (int layers = 1; layers <= 6; ++layers) {
    int combos = 1;
    for (int i = 0; i < layers; ++i) combos *= 3;
    for (int code = 0; code < combos; ++code) {
      IntCase c;
      for (int i = 0, rest = code; i < layers; ++i, rest /= 3) {
        c.costs.push_back(rest % 3);
      }
      for (c.stages = 1; c.stages <= layers; ++c.stages) {
        SCOPED_TRACE(c.DebugString());
        absl::StatusOr<Partition> got = PartitionLayers(c.Input());
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->stage_begin, BruteForce(c).stage_begin);
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 3 * 1 + 9 * 2 + 27 * 3 + 81 * 4 + 243 * 5 + 729 * 6);
}

TEST(PartitionerTest, BalancedMatchesBruteForceOnRealValuedCosts) {
  // Non-integer costs: the header defines a stage's cost as the difference
  // of long double prefix sums rounded to double, and the optimum over those
  // values must come out exactly.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> value(0.0, 1.0);
  for (int trial = 0; trial < 1500; ++trial) {
    const int layers = std::uniform_int_distribution<int>(1, 9)(rng);
    PartitionInput in;
    in.num_stages = std::uniform_int_distribution<int>(1, layers)(rng);
    for (int i = 0; i < layers; ++i) {
      in.costs.push_back(value(rng) * 1e-3);  // seconds
      in.memory.push_back(value(rng) * 1e9);  // bytes
    }
    in.memory_cap = 1e9 * layers / in.num_stages;
    std::vector<long double> prefix(1, 0.0L), mem_prefix(1, 0.0L);
    for (int i = 0; i < layers; ++i) {
      prefix.push_back(prefix.back() + in.costs[i]);
      mem_prefix.push_back(mem_prefix.back() + in.memory[i]);
    }
    auto cost = [&](int i, int j) {
      return static_cast<double>(prefix[j] - prefix[i]);
    };
    auto memory = [&](int i, int j) {
      return static_cast<double>(mem_prefix[j] - mem_prefix[i]);
    };
    double want = std::numeric_limits<double>::infinity();
    ForEachSplit(layers, in.num_stages, [&](const std::vector<int>& begin) {
      double max_cost = 0;
      for (int s = 0; s < in.num_stages; ++s) {
        const int end = StageEndOf(begin, s, layers);
        if (memory(begin[s], end) > *in.memory_cap) return;
        max_cost = std::max(max_cost, cost(begin[s], end));
      }
      want = std::min(want, max_cost);
    });
    absl::StatusOr<Partition> got = PartitionLayers(in);
    if (std::isinf(want)) {
      EXPECT_FALSE(got.ok());
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->max_stage_cost, want) << "trial " << trial;
    for (int s = 0; s < in.num_stages; ++s) {
      EXPECT_LE(got->stage_memory[s], *in.memory_cap);
    }
  }
}

TEST(PartitionerTest, BalancedMatchesReferenceDpOnMediumInputs) {
  // Past brute-force sizes, against a plain O(S L^2) DP: this is where the
  // divide-and-conquer rows and column windows get exercised.
  std::mt19937 rng(99);
  int feasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    IntCase c = RandomCase(rng, /*max_layers=*/70, /*max_value=*/30,
                           /*with_memory=*/trial % 3 == 0);
    c.stages = std::min(c.stages, 16);
    SCOPED_TRACE(c.DebugString());
    const std::vector<int> want = ReferenceDp(c);
    absl::StatusOr<Partition> got = PartitionLayers(c.Input());
    if (want.empty()) {
      EXPECT_FALSE(got.ok());
      continue;
    }
    ++feasible;
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectConsistent(*got, c);
    EXPECT_EQ(got->stage_begin, want);
  }
  EXPECT_GT(feasible, 200);
}

TEST(PartitionerTest, BalancedIsOptimalOnALargeModel) {
  // L = 2000, S = 64 (the size the coordinator needs to be fast on). An
  // optimality certificate independent of the implementation: the greedy
  // needs at most S stages at the reported bound and more just below it.
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> value(1e-4, 5e-3);
  PartitionInput in;
  in.num_stages = 64;
  for (int i = 0; i < 2000; ++i) in.costs.push_back(value(rng));
  absl::StatusOr<Partition> p = PartitionLayers(in);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->num_stages(), 64);
  auto greedy_stages = [&](double limit) {
    int stages = 0;
    for (int i = 0; i < 2000; ++stages) {
      long double sum = 0;
      int j = i;
      while (j < 2000 && sum + in.costs[j] <= limit) sum += in.costs[j++];
      if (j == i) return 1 << 30;
      i = j;
    }
    return stages;
  };
  const double bound = p->max_stage_cost;
  EXPECT_LE(greedy_stages(bound * (1 + 1e-12)), 64);
  EXPECT_GT(greedy_stages(bound * (1 - 1e-12)), 64);
  for (int s = 0; s < 64; ++s) EXPECT_LE(p->stage_cost[s], bound);
}

TEST(PartitionerTest, UniformGivesTheRemainderToTheFirstStages) {
  absl::StatusOr<Partition> p =
      PartitionUniform({.costs = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
                        .memory = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                        .num_stages = 4});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 3, 6, 8));
  EXPECT_THAT(p->stage_cost, ElementsAre(6, 15, 15, 19));
  EXPECT_THAT(p->stage_memory, ElementsAre(3, 3, 2, 2));
  EXPECT_EQ(p->max_stage_cost, 19);

  // Costs do not move the boundaries.
  p = PartitionUniform({.costs = {100, 0, 0, 0, 0, 0}, .num_stages = 3});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 2, 4));
  EXPECT_THAT(p->stage_cost, ElementsAre(100, 0, 0));
}

TEST(PartitionerTest, UniformMatchesTheFormulaForAllSmallSizes) {
  for (int layers = 1; layers <= 40; ++layers) {
    for (int stages = 1; stages <= layers; ++stages) {
      absl::StatusOr<Partition> p = PartitionUniform(
          {.costs = std::vector<double>(layers, 1.0), .num_stages = stages});
      ASSERT_TRUE(p.ok()) << p.status();
      for (int s = 0; s < stages; ++s) {
        const int want = layers / stages + (s < layers % stages ? 1 : 0);
        EXPECT_EQ(p->NumLayersInStage(s), want)
            << "L=" << layers << " S=" << stages << " stage " << s;
      }
      EXPECT_EQ(p->StageEnd(stages - 1), layers);
    }
  }
}

TEST(PartitionerTest, UniformOverTheCapNamesTheStage) {
  // Uniform puts {1, 1} | {1, 9}; {1, 1, 1} | {9} would need only 9.
  absl::StatusOr<Partition> p = PartitionUniform({.costs = {1, 1, 1, 1},
                                                  .memory = {1, 1, 1, 9},
                                                  .memory_cap = 5,
                                                  .num_stages = 2});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(),
              HasSubstr("stage 1 of the uniform split (layers 2..3) needs "
                        "memory 10, over memory_cap = 5"));
  EXPECT_THAT(p.status().message(),
              HasSubstr("smallest max stage memory any split reaches is 9"));

  // Within the cap it succeeds and reports memory.
  p = PartitionUniform({.costs = {1, 1, 1, 1},
                        .memory = {1, 1, 1, 9},
                        .memory_cap = 10,
                        .num_stages = 2});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_memory, ElementsAre(2, 10));
}

TEST(PartitionerTest, WithStrategyDispatches) {
  const PartitionInput in = {.costs = {8, 1, 1, 1, 1, 1, 1, 1, 1},
                             .num_stages = 3};
  absl::StatusOr<Partition> uniform =
      PartitionWithStrategy(PartitionStrategy::kUniform, in);
  absl::StatusOr<Partition> balanced =
      PartitionWithStrategy(PartitionStrategy::kBalanced, in);
  absl::StatusOr<Partition> parameters =
      PartitionWithStrategy(PartitionStrategy::kParameters, in);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  ASSERT_TRUE(parameters.ok()) << parameters.status();
  EXPECT_THAT(uniform->stage_begin, ElementsAre(0, 3, 6));
  EXPECT_EQ(uniform->max_stage_cost, 10);
  EXPECT_THAT(balanced->stage_begin, ElementsAre(0, 1, 5));
  EXPECT_EQ(balanced->max_stage_cost, 8);
  // Balancing parameter counts is the same min-max problem.
  EXPECT_EQ(parameters->stage_begin, balanced->stage_begin);
}

TEST(PartitionerTest, PartitionHelpersMapLayersAndStages) {
  Partition p;
  p.num_layers = 7;
  p.stage_begin = {0, 3, 4};
  EXPECT_EQ(p.num_stages(), 3);
  EXPECT_EQ(p.StageEnd(0), 3);
  EXPECT_EQ(p.StageEnd(1), 4);
  EXPECT_EQ(p.StageEnd(2), 7);
  EXPECT_EQ(p.NumLayersInStage(0), 3);
  EXPECT_EQ(p.NumLayersInStage(1), 1);
  EXPECT_EQ(p.NumLayersInStage(2), 3);
  std::vector<int> stage_of;
  for (int layer = 0; layer < 7; ++layer) {
    stage_of.push_back(p.StageOfLayer(layer));
  }
  EXPECT_THAT(stage_of, ElementsAre(0, 0, 0, 1, 2, 2, 2));
}

TEST(PartitionerTest, OneStageAndOneLayerPerStageAreTheExtremes) {
  absl::StatusOr<Partition> p =
      PartitionLayers({.costs = {3, 1, 2}, .num_stages = 1});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0));
  EXPECT_EQ(p->max_stage_cost, 6);
  p = PartitionLayers({.costs = {3, 1, 2}, .num_stages = 3});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage_begin, ElementsAre(0, 1, 2));
  EXPECT_EQ(p->max_stage_cost, 3);
  // All-zero costs are legal (a model not yet profiled).
  p = PartitionLayers({.costs = {0, 0, 0, 0}, .num_stages = 2});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->max_stage_cost, 0);
  EXPECT_EQ(p->num_stages(), 2);
}

struct ErrorCase {
  std::string name;
  PartitionInput input;
  std::string message;
};

std::vector<ErrorCase> ErrorCases() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  return {
      {"zero stages",
       {.costs = {1, 2}, .num_stages = 0},
       "num_stages must be in 1..1024, got 0"},
      {"negative stages",
       {.costs = {1, 2}, .num_stages = -3},
       "num_stages must be in 1..1024, got -3"},
      {"too many stages",
       {.costs = std::vector<double>(2000, 1.0), .num_stages = 1025},
       "num_stages must be in 1..1024, got 1025"},
      {"empty costs",
       {.costs = {}, .num_stages = 1},
       "costs must have one entry per layer, got none"},
      {"too many layers",
       {.costs = std::vector<double>(kMaxPartitionLayers + 1, 1.0),
        .num_stages = 1},
       "costs has 16385 layers; at most 16384 are supported"},
      {"more stages than layers",
       {.costs = {1, 2, 3}, .num_stages = 4},
       "num_stages (4) must not exceed the number of layers (3): every stage "
       "needs at least one layer"},
      {"negative cost",
       {.costs = {1, -1, 3}, .num_stages = 1},
       "costs[1] must be finite and >= 0, got -1"},
      {"nan cost",
       {.costs = {nan, 1}, .num_stages = 1},
       "costs[0] must be finite and >= 0, got nan"},
      {"infinite cost",
       {.costs = {1, 2, inf}, .num_stages = 1},
       "costs[2] must be finite and >= 0, got inf"},
      {"costs overflow",
       {.costs = {1e308, 1e308}, .num_stages = 1},
       "the sum of costs overflows a double"},
      {"short memory",
       {.costs = {1, 2, 3}, .memory = {1, 2}, .num_stages = 1},
       "memory must be empty or have one entry per layer (3), got 2"},
      {"long memory",
       {.costs = {1, 2}, .memory = {1, 2, 3, 4}, .num_stages = 1},
       "memory must be empty or have one entry per layer (2), got 4"},
      {"negative memory",
       {.costs = {1, 2, 3}, .memory = {1, 2, -0.5}, .num_stages = 1},
       "memory[2] must be finite and >= 0, got -0.5"},
      {"nan memory",
       {.costs = {1, 2}, .memory = {nan, 2}, .num_stages = 1},
       "memory[0] must be finite and >= 0, got nan"},
      {"memory overflow",
       {.costs = {1, 2}, .memory = {1e308, 1e308}, .num_stages = 1},
       "the sum of memory overflows a double"},
      {"cap without memory",
       {.costs = {1, 2}, .memory_cap = 10, .num_stages = 1},
       "memory_cap is set but memory is empty"},
      {"negative cap",
       {.costs = {1, 2}, .memory = {1, 1}, .memory_cap = -1, .num_stages = 1},
       "memory_cap must be finite and >= 0, got -1"},
      {"nan cap",
       {.costs = {1, 2}, .memory = {1, 1}, .memory_cap = nan, .num_stages = 1},
       "memory_cap must be finite and >= 0, got nan"},
      {"infinite cap",
       {.costs = {1, 2}, .memory = {1, 1}, .memory_cap = inf, .num_stages = 1},
       "memory_cap must be finite and >= 0, got inf"},
  };
}

TEST(PartitionerTest, InvalidInputsAreRejectedWithFieldAndRule) {
  for (PartitionStrategy strategy :
       {PartitionStrategy::kBalanced, PartitionStrategy::kUniform,
        PartitionStrategy::kParameters}) {
    for (const ErrorCase& e : ErrorCases()) {
      SCOPED_TRACE(absl::StrCat(PartitionStrategyName(strategy), ": ", e.name));
      absl::StatusOr<Partition> p = PartitionWithStrategy(strategy, e.input);
      ASSERT_FALSE(p.ok());
      EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(p.status().message(), HasSubstr(e.message));
    }
  }
}

}  // namespace
}  // namespace conveyor::scheduler
