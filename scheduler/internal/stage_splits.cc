#include "scheduler/internal/stage_splits.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <limits>
#include <numeric>

#include "common/check.h"
#include "common/status_macros.h"
#include "scheduler/partitioner.h"

namespace conveyor::scheduler::stage_search_internal {

std::vector<long double> PrefixSums(const std::vector<double>& values) {
  std::vector<long double> prefix(values.size() + 1, 0.0L);
  for (size_t i = 0; i < values.size(); ++i) {
    prefix[i + 1] = prefix[i] + values[i];
  }
  return prefix;
}

std::vector<int> UniformSplit(int layers, int stages) {
  std::vector<int> stage_begin;
  for (int s = 0, begin = 0; s < stages; ++s) {
    stage_begin.push_back(begin);
    begin += layers / stages + (s < layers % stages ? 1 : 0);
  }
  return stage_begin;
}

int64_t CappedBinomial(int64_t n, int64_t k, int64_t cap) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  // C(n, i) grows with i up to n / 2, so once a partial value reaches the cap
  // the answer does too.
  int64_t c = 1;
  for (int64_t i = 0; i < k; ++i) {
    // C(n, i + 1) = C(n, i) * (n - i) / (i + 1), exactly; divide by the common
    // factor first so the product overflows only when the result would.
    const int64_t g = std::gcd(c, i + 1);
    const int64_t a = c / g, b = (n - i) / ((i + 1) / g);
    if (a > std::numeric_limits<int64_t>::max() / b) return cap;
    c = a * b;
    if (c >= cap) return cap;
  }
  return c;
}

SplitEnumerator::SplitEnumerator(int layers, int stages,
                                 const std::vector<int>& fixed)
    : fixed_(fixed) {
  for (int p = 1; p < layers; ++p) {
    if (!std::binary_search(fixed.begin(), fixed.end(), p)) {
      free_.push_back(p);
    }
  }
  const int k = stages - 1 - static_cast<int>(fixed.size());
  pick_.resize(k);
  std::iota(pick_.begin(), pick_.end(), 0);
}

int64_t SplitEnumerator::Count(int64_t cap) const {
  return CappedBinomial(static_cast<int64_t>(free_.size()),
                        static_cast<int64_t>(pick_.size()), cap);
}

bool SplitEnumerator::Next(std::vector<int>* stage_begin) {
  if (done_) return false;
  if (started_ && !Advance()) {
    done_ = true;
    return false;
  }
  started_ = true;
  std::vector<int> chosen;
  chosen.reserve(pick_.size());
  for (int i : pick_) chosen.push_back(free_[i]);
  stage_begin->assign(1, 0);
  std::merge(fixed_.begin(), fixed_.end(), chosen.begin(), chosen.end(),
             std::back_inserter(*stage_begin));
  return true;
}

bool SplitEnumerator::Advance() {
  const int k = static_cast<int>(pick_.size());
  const int n = static_cast<int>(free_.size());
  int i = k - 1;
  while (i >= 0 && pick_[i] == n - k + i) --i;
  if (i < 0) return false;
  ++pick_[i];
  for (int j = i + 1; j < k; ++j) pick_[j] = pick_[j - 1] + 1;
  return true;
}

absl::StatusOr<std::vector<int>> SeedSplit(const std::vector<double>& costs,
                                           const std::vector<int>& fixed,
                                           int stages, bool uniform) {
  const int layers = static_cast<int>(costs.size());
  std::vector<int> bounds = {0};
  bounds.insert(bounds.end(), fixed.begin(), fixed.end());
  bounds.push_back(layers);
  const int segments = static_cast<int>(bounds.size()) - 1;
  const std::vector<long double> prefix = PrefixSums(costs);
  auto cost = [&](int i, int j) {
    return static_cast<double>(prefix[j] - prefix[i]);
  };
  // The fewest stages covering segment k with every stage cost <= limit, or
  // stages + 1 when a layer alone is over it.
  auto min_stages = [&](int k, double limit) {
    int count = 0;
    for (int i = bounds[k]; i < bounds[k + 1];) {
      int j = i;
      while (j < bounds[k + 1] && cost(i, j + 1) <= limit) ++j;
      if (j == i) return stages + 1;
      i = j;
      ++count;
    }
    return count;
  };
  auto total_stages = [&](double limit) {
    int64_t total = 0;
    for (int k = 0; k < segments; ++k) total += min_stages(k, limit);
    return total;
  };
  // Non-negative doubles order like their bit patterns. At the total cost
  // every segment needs one stage, and there are at most S segments.
  uint64_t lo = 0, hi = std::bit_cast<uint64_t>(cost(0, layers));
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (total_stages(std::bit_cast<double>(mid)) <= stages) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const double limit = std::bit_cast<double>(hi);
  std::vector<int> share(segments);
  int given = 0;
  for (int k = 0; k < segments; ++k) {
    share[k] = min_stages(k, limit);
    given += share[k];
  }
  CONVEYOR_CHECK(given <= stages, "the binary search ends at a feasible cost");
  for (; given < stages; ++given) {
    // The segments hold L >= S layers in all, so one has room.
    int best = -1;
    for (int k = 0; k < segments; ++k) {
      if (share[k] >= bounds[k + 1] - bounds[k]) continue;
      if (best < 0 || cost(bounds[k], bounds[k + 1]) / share[k] >
                          cost(bounds[best], bounds[best + 1]) / share[best]) {
        best = k;
      }
    }
    CONVEYOR_CHECK(best >= 0, "some segment has a layer without a stage");
    ++share[best];
  }

  std::vector<int> stage_begin;
  for (int k = 0; k < segments; ++k) {
    PartitionInput part;
    part.costs.assign(costs.begin() + bounds[k], costs.begin() + bounds[k + 1]);
    part.num_stages = share[k];
    ASSIGN_OR_RETURN(Partition p,
                     uniform ? PartitionUniform(part) : PartitionLayers(part));
    for (int b : p.stage_begin) stage_begin.push_back(bounds[k] + b);
  }
  return stage_begin;
}

}  // namespace conveyor::scheduler::stage_search_internal
