// The candidate splits of a stage search (stage_search.h): a split is the
// first layer of each of S stages (stage_begin). This counts and enumerates
// the splits whose boundaries include the fixed ones, for exhaustive search,
// and builds the seeds local search starts from. Internal to scheduler/.
//
// Pure functions, and a SplitEnumerator that one thread uses at a time.
#ifndef CONVEYOR_SCHEDULER_INTERNAL_STAGE_SPLITS_H_
#define CONVEYOR_SCHEDULER_INTERNAL_STAGE_SPLITS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor::scheduler::stage_search_internal {

// prefix[i] = values[0] + ... + values[i - 1], in long double.
std::vector<long double> PrefixSums(const std::vector<double>& values);

// The first L % S stages hold one layer more, as PartitionUniform.
std::vector<int> UniformSplit(int layers, int stages);

// C(n, k), or `cap` when it is at least `cap` (cap >= 1).
int64_t CappedBinomial(int64_t n, int64_t k, int64_t cap);

// Enumerates, in increasing lexicographic order of stage_begin, the splits
// into `stages` stages whose boundaries include every fixed one: the free
// boundaries are any (S-1-F)-subset of the positions 1..L-1 not fixed.
class SplitEnumerator {
 public:
  // `fixed` (ascending, in 1..layers-1, at most stages - 1 of them) outlives
  // the enumerator.
  SplitEnumerator(int layers, int stages, const std::vector<int>& fixed);

  // The number of splits, capped as CappedBinomial.
  int64_t Count(int64_t cap) const;

  // Writes the next split to `stage_begin`; false when there is none left.
  bool Next(std::vector<int>* stage_begin);

 private:
  // The next combination in lexicographic order, which (the fixed positions
  // being the same in every split) is also the next stage_begin in order.
  bool Advance();

  const std::vector<int>& fixed_;
  std::vector<int> free_;
  std::vector<int> pick_;  // indices into free_, increasing
  bool started_ = false;
  bool done_ = false;
};

// A seed split of `costs` into `stages` stages that begins a stage at every
// fixed boundary. The fixed boundaries cut the layers into segments; each
// segment gets the fewest stages that reach the best overall max stage cost
// (a binary search over that cost, as the partitioner's), the stages left
// over go one at a time to the segment with the largest cost per stage, and
// each segment is split by PartitionLayers (uniform = false) or
// PartitionUniform. Without fixed boundaries this is exactly
// PartitionLayers(costs, stages) or PartitionUniform. The partitioner's
// errors.
absl::StatusOr<std::vector<int>> SeedSplit(const std::vector<double>& costs,
                                           const std::vector<int>& fixed,
                                           int stages, bool uniform);

}  // namespace conveyor::scheduler::stage_search_internal

#endif  // CONVEYOR_SCHEDULER_INTERNAL_STAGE_SPLITS_H_
