#include "scheduler/partitioner.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace conveyor::scheduler {
namespace {

// Text that reads back as the same double, so a reported memory bound can be
// pasted into a config as is (StrCat keeps only 6 digits). Whole numbers below
// 1e18 (byte counts) print in full rather than as 1e+09.
std::string Num(double value) {
  char buf[32];
  const bool whole = std::abs(value) < 1e18 && value == std::trunc(value);
  const auto [end, ec] = whole ? std::to_chars(buf, buf + sizeof(buf), value,
                                               std::chars_format::fixed)
                               : std::to_chars(buf, buf + sizeof(buf), value);
  CONVEYOR_CHECK(ec == std::errc(), "32 bytes hold any double");
  return std::string(buf, end);
}

absl::Status CheckValues(absl::string_view field,
                         const std::vector<double>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]) || values[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "] must be finite and >= 0, got ", Num(values[i])));
    }
  }
  return absl::OkStatus();
}

// Long double prefix sums: segment sums are differences of two prefixes, and
// the extra precision (64-bit mantissa on x86-64) keeps integer-valued inputs
// exact where double prefixes would start rounding at 2^53.
std::vector<long double> PrefixSums(const std::vector<double>& values) {
  std::vector<long double> prefix(values.size() + 1, 0.0L);
  for (size_t i = 0; i < values.size(); ++i) {
    prefix[i + 1] = prefix[i] + values[i];
  }
  return prefix;
}

absl::Status CheckInput(const PartitionInput& in) {
  if (in.num_stages < 1 || in.num_stages > kMaxPartitionStages) {
    return absl::InvalidArgumentError(absl::StrCat("num_stages must be in 1..",
                                                   kMaxPartitionStages,
                                                   ", got ", in.num_stages));
  }
  if (in.costs.empty()) {
    return absl::InvalidArgumentError(
        "costs must have one entry per layer, got none");
  }
  if (in.costs.size() > static_cast<size_t>(kMaxPartitionLayers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("costs has ", in.costs.size(), " layers; at most ",
                     kMaxPartitionLayers, " are supported"));
  }
  const int layers = static_cast<int>(in.costs.size());
  if (in.num_stages > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages (", in.num_stages,
                     ") must not exceed the number of layers (", layers,
                     "): every stage needs at least one layer"));
  }
  RETURN_IF_ERROR(CheckValues("costs", in.costs));
  if (!in.memory.empty() && in.memory.size() != in.costs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory must be empty or have one entry per layer (",
                     layers, "), got ", in.memory.size()));
  }
  RETURN_IF_ERROR(CheckValues("memory", in.memory));
  if (in.memory_cap.has_value()) {
    if (in.memory.empty()) {
      return absl::InvalidArgumentError(
          "memory_cap is set but memory is empty: a cap needs per-layer "
          "memory");
    }
    if (!std::isfinite(*in.memory_cap) || *in.memory_cap < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory_cap must be finite and >= 0, got ", Num(*in.memory_cap)));
    }
  }
  return absl::OkStatus();
}

// Segment sums over [i, j) and the constraints a stage must meet. Segment
// sums only grow when a segment grows (prefixes are non-decreasing and
// rounding is monotone), which is all the greedy and the DP below rely on.
class Segments {
 public:
  // `cap` applies to `memory`; `memory` may be empty (no cap then).
  Segments(const std::vector<double>& costs, const std::vector<double>& memory,
           std::optional<double> cap)
      : layers_(static_cast<int>(costs.size())),
        cost_prefix_(PrefixSums(costs)),
        memory_prefix_(PrefixSums(memory)),
        cap_(cap) {}

  int layers() const { return layers_; }
  double Cost(int i, int j) const {
    return static_cast<double>(cost_prefix_[j] - cost_prefix_[i]);
  }
  double Memory(int i, int j) const {
    return static_cast<double>(memory_prefix_[j] - memory_prefix_[i]);
  }
  bool Fits(int i, int j, double cost_limit) const {
    return Cost(i, j) <= cost_limit && (!cap_ || Memory(i, j) <= *cap_);
  }

  // The largest j with Fits(i, j, cost_limit), or i when layer i alone does
  // not fit.
  int FarthestEnd(int i, double cost_limit) const {
    int j = i;
    while (j < layers_ && Fits(i, j + 1, cost_limit)) ++j;
    return j;
  }

  // The fewest stages covering all layers within `cost_limit` and the cap, or
  // max_stages + 1 when more than max_stages are needed. Taking the longest
  // stage that fits is optimal because every part of a fitting segment fits.
  // A split into fewer stages can be refined into any count up to L, so this
  // decides whether exactly S stages are possible. O(L).
  int MinStages(double cost_limit, int max_stages) const {
    int stages = 0;
    for (int i = 0; i < layers_;) {
      const int j = FarthestEnd(i, cost_limit);
      if (j == i || stages == max_stages) return max_stages + 1;
      i = j;
      ++stages;
    }
    return stages;
  }

  // The smallest double T such that some split into `stages` stages has every
  // stage cost <= T (and fits the cap). Binary search over the bit patterns
  // of non-negative doubles, which order like the doubles themselves, so the
  // result is exactly the optimal max stage cost, in at most 64 steps of O(L).
  // Requires MinStages(+inf, stages) <= stages.
  double MinMaxCost(int stages) const {
    uint64_t lo = 0;
    uint64_t hi = std::bit_cast<uint64_t>(Cost(0, layers_));
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (MinStages(std::bit_cast<double>(mid), stages) <= stages) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return std::bit_cast<double>(hi);
  }

 private:
  int layers_;
  std::vector<long double> cost_prefix_;
  std::vector<long double> memory_prefix_;
  std::optional<double> cap_;
};

// The smallest max stage memory over all splits into in.num_stages stages:
// the smallest memory_cap that admits a split.
double MinMaxMemory(const PartitionInput& in) {
  const Segments memory_only(in.memory, {}, std::nullopt);
  return memory_only.MinMaxCost(in.num_stages);
}

// Among splits into `stages` stages with every stage fitting `cost_limit`,
// the one with the least sum of squared stage costs, ties going to the
// lexicographically largest stage_begin. Requires such a split to exist.
//
// Suffix DP: g_r[i] is the least sum for layers [i, L) in r stages,
//   g_r[i] = min over j of sq(i, j) + g_{r-1}[j],
// over the j where [i, j) fits and [j, L) can take r-1 stages. sq is convex
// in the segment sum, so the matrix sq(i, j) + g_{r-1}[j] is Monge and the
// rightmost minimising j never decreases as i grows; divide and conquer over
// i then finds every row's rightmost minimum in O(L log L) per r. The rows
// and the columns kept are those where the value is finite, and both ends of
// a row's column range grow with i, which keeps the Monge argument valid.
std::vector<int> MostEvenSplit(const Segments& seg, int stages,
                               double cost_limit) {
  const int layers = seg.layers();
  constexpr long double kInf = std::numeric_limits<long double>::infinity();

  // far[i]: the longest stage starting at i; min_stages[i]: the fewest stages
  // covering [i, L); reach[k]: the farthest k stages from layer 0 get. All
  // are monotone.
  std::vector<int> far(layers);
  for (int i = 0, j = 0; i < layers; ++i) {
    j = std::max(j, i);
    while (j < layers && seg.Fits(i, j + 1, cost_limit)) ++j;
    far[i] = j;
  }
  std::vector<int> min_stages(layers + 1, 0);
  for (int i = layers - 1; i >= 0; --i) {
    min_stages[i] = far[i] == i ? stages + 1 : 1 + min_stages[far[i]];
  }
  std::vector<int> reach(stages + 1, 0);
  for (int k = 0; k < stages; ++k) {
    reach[k + 1] = reach[k] == layers ? layers : far[reach[k]];
  }

  // Squares of costs scaled by a power of two (exact) into [0, 1), so sums of
  // up to S of them cannot overflow even where long double is double.
  int exponent = 0;
  std::frexp(cost_limit, &exponent);
  const long double scale = std::ldexp(1.0L, -exponent);
  auto sq = [&](int i, int j) {
    const long double x = seg.Cost(i, j) * scale;
    return x * x;
  };

  std::vector<long double> prev(layers + 1, kInf), cur(layers + 1, kInf);
  prev[layers] = 0;
  // choice[(r - 1) * (L + 1) + i]: where the first of r stages from i ends.
  std::vector<int> choice(static_cast<size_t>(stages) * (layers + 1), -1);
  int first_row = layers;  // the smallest i whose suffix takes r stages
  int prev_row_lo = layers;
  for (int r = 1; r <= stages; ++r) {
    while (first_row > 0 && min_stages[first_row - 1] <= r) --first_row;
    // Row i is where stage S - r starts, so only rows some full split passes
    // through matter: the S - r stages before i need S - r <= i <= reach,
    // and the r stages from i need first_row <= i <= L - r. At r = S that
    // leaves row 0 alone.
    const int row_lo = std::max(first_row, stages - r);
    const int row_hi = std::min(layers - r, reach[stages - r]);
    // Within the rows solved for r - 1 (far[i] <= reach[S - r + 1]).
    auto col_lo = [&](int i) { return std::max(i + 1, prev_row_lo); };
    auto col_hi = [&](int i) { return std::min(far[i], layers - r + 1); };
    int* row_choice = &choice[static_cast<size_t>(r - 1) * (layers + 1)];
    std::fill(cur.begin(), cur.end(), kInf);

    // Solves rows [a, b] knowing their rightmost minima lie in [ca, cb].
    auto solve = [&](auto& self, int a, int b, int ca, int cb) -> void {
      if (a > b) return;
      const int mid = a + (b - a) / 2;
      int lo = std::max(ca, col_lo(mid));
      int hi = std::min(cb, col_hi(mid));
      // Rounding in long double could, in principle, bend the monotone
      // minima; then scan the whole row rather than an empty range.
      if (lo > hi) {
        lo = col_lo(mid);
        hi = col_hi(mid);
      }
      long double best = kInf;
      int best_j = lo;
      for (int j = lo; j <= hi; ++j) {
        const long double v = sq(mid, j) + prev[j];
        if (v <= best) {
          best = v;
          best_j = j;
        }
      }
      cur[mid] = best;
      row_choice[mid] = best_j;
      self(self, a, mid - 1, ca, best_j);
      self(self, mid + 1, b, best_j, cb);
    };
    CONVEYOR_CHECK(row_lo <= row_hi, "some split passes through every stage");
    solve(solve, row_lo, row_hi, 0, layers);
    std::swap(prev, cur);
    prev_row_lo = row_lo;
  }

  std::vector<int> stage_begin;
  stage_begin.reserve(stages);
  int i = 0;
  for (int r = stages; r >= 1; --r) {
    stage_begin.push_back(i);
    // Every row the path reaches was solved, with a finite value.
    i = choice[static_cast<size_t>(r - 1) * (layers + 1) + i];
    CONVEYOR_CHECK(
        i > stage_begin.back() && i <= layers - (r - 1),
        "each stage ends after it begins, leaving a layer per later stage");
  }
  CONVEYOR_CHECK(i == layers, "the stages cover every layer");
  return stage_begin;
}

// The totals bound every stage sum, so finite totals keep all sums finite.
absl::Status CheckTotals(const Segments& seg, const PartitionInput& in) {
  if (!std::isfinite(seg.Cost(0, seg.layers()))) {
    return absl::InvalidArgumentError("the sum of costs overflows a double");
  }
  if (!in.memory.empty() && !std::isfinite(seg.Memory(0, seg.layers()))) {
    return absl::InvalidArgumentError("the sum of memory overflows a double");
  }
  return absl::OkStatus();
}

Partition MakePartition(const Segments& seg, const PartitionInput& in,
                        std::vector<int> stage_begin) {
  Partition p;
  p.num_layers = seg.layers();
  p.stage_begin = std::move(stage_begin);
  for (int s = 0; s < p.num_stages(); ++s) {
    const int begin = p.stage_begin[s], end = p.StageEnd(s);
    p.stage_cost.push_back(seg.Cost(begin, end));
    if (!in.memory.empty()) p.stage_memory.push_back(seg.Memory(begin, end));
  }
  p.max_stage_cost =
      *std::max_element(p.stage_cost.begin(), p.stage_cost.end());
  return p;
}

}  // namespace

absl::string_view PartitionStrategyName(PartitionStrategy strategy) {
  switch (strategy) {
    case PartitionStrategy::kBalanced:
      return "balanced";
    case PartitionStrategy::kUniform:
      return "uniform";
    case PartitionStrategy::kParameters:
      return "parameters";
  }
  return "unknown";
}

absl::StatusOr<PartitionStrategy> ParsePartitionStrategy(
    absl::string_view name) {
  for (PartitionStrategy strategy :
       {PartitionStrategy::kBalanced, PartitionStrategy::kUniform,
        PartitionStrategy::kParameters}) {
    if (PartitionStrategyName(strategy) == name) return strategy;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown partition strategy '", name,
                   "'; allowed: ", kPartitionStrategyNames));
}

int Partition::StageEnd(int stage) const {
  return stage + 1 < num_stages() ? stage_begin[stage + 1] : num_layers;
}

int Partition::StageOfLayer(int layer) const {
  return static_cast<int>(
             std::upper_bound(stage_begin.begin(), stage_begin.end(), layer) -
             stage_begin.begin()) -
         1;
}

absl::StatusOr<Partition> PartitionLayers(const PartitionInput& input) {
  RETURN_IF_ERROR(CheckInput(input));
  const Segments seg(input.costs, input.memory, input.memory_cap);
  RETURN_IF_ERROR(CheckTotals(seg, input));
  constexpr double kUnlimited = std::numeric_limits<double>::infinity();
  if (seg.MinStages(kUnlimited, input.num_stages) > input.num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no split of ", seg.layers(), " layers into ", input.num_stages,
        " stages keeps every stage's memory within memory_cap = ",
        Num(*input.memory_cap),
        "; the smallest achievable max stage memory is ",
        Num(MinMaxMemory(input)), ", so memory_cap must be at least that"));
  }
  const double best = seg.MinMaxCost(input.num_stages);
  Partition p =
      MakePartition(seg, input, MostEvenSplit(seg, input.num_stages, best));
  // The split meets `best` by construction, and nothing beats `best`.
  CONVEYOR_CHECK(p.max_stage_cost == best,
                 "the most even split keeps the optimum");
  return p;
}

absl::StatusOr<Partition> PartitionUniform(const PartitionInput& input) {
  RETURN_IF_ERROR(CheckInput(input));
  const Segments seg(input.costs, input.memory, input.memory_cap);
  RETURN_IF_ERROR(CheckTotals(seg, input));
  const int layers = seg.layers(), stages = input.num_stages;
  std::vector<int> stage_begin;
  for (int s = 0, begin = 0; s < stages; ++s) {
    stage_begin.push_back(begin);
    begin += layers / stages + (s < layers % stages ? 1 : 0);
  }
  Partition p = MakePartition(seg, input, std::move(stage_begin));
  if (input.memory_cap.has_value()) {
    for (int s = 0; s < stages; ++s) {
      if (p.stage_memory[s] > *input.memory_cap) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stage ", s, " of the uniform split (layers ", p.stage_begin[s],
            "..", p.StageEnd(s) - 1, ") needs memory ", Num(p.stage_memory[s]),
            ", over memory_cap = ", Num(*input.memory_cap),
            "; the smallest max stage memory any split reaches is ",
            Num(MinMaxMemory(input))));
      }
    }
  }
  return p;
}

absl::StatusOr<Partition> PartitionWithStrategy(PartitionStrategy strategy,
                                                const PartitionInput& input) {
  switch (strategy) {
    case PartitionStrategy::kBalanced:
    case PartitionStrategy::kParameters:
      return PartitionLayers(input);
    case PartitionStrategy::kUniform:
      return PartitionUniform(input);
  }
  return absl::InvalidArgumentError("unknown partition strategy");
}

}  // namespace conveyor::scheduler

#undef PARTITIONER_CHECK_
