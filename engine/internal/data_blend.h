// BlendSchedule: which data set of a weighted blend each sample comes from,
// as a pure function of the weights (engine/data.h "Blends"): Megatron's
// greedy rule over exact integer weights, which repeats with period P = sum
// of the integer weights, so one period is tabulated and any sample index
// is answered in O(1).
//
// Not API: only engine/data*.cc and their tests include this. Thread-safe:
// immutable after Create.
#ifndef CONVEYOR_ENGINE_INTERNAL_DATA_BLEND_H_
#define CONVEYOR_ENGINE_INTERNAL_DATA_BLEND_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/data.h"

namespace conveyor::engine::data_internal {

// Weights not exact in decimals are rounded to parts of this (fewer for
// blends of more than 256 data sets, which would take long to tabulate).
inline constexpr int64_t kBlendResolution = int64_t{1} << 20;

class BlendSchedule {
 public:
  // InvalidArgument naming data.blend[k].weight for a weight that is not
  // finite and positive, or for fewer than 2 or more than
  // kMaxBlendEntries weights.
  static absl::StatusOr<BlendSchedule> Create(absl::Span<const double> weights);

  // The integer weights a_k (divided by their gcd) and their sum P.
  const std::vector<int64_t>& parts() const { return parts_; }
  int64_t period() const { return static_cast<int64_t>(component_.size()); }

  // Blend sample i >= 0 -> (data set k, n): it is the n-th sample (from 0)
  // drawn from data set k.
  std::pair<int, int64_t> Locate(int64_t i) const {
    const int64_t p = period();
    const int64_t r = i % p;
    const int k = component_[r];
    return {k, (i / p) * parts_[k] + rank_[r]};
  }

 private:
  BlendSchedule() = default;

  std::vector<int64_t> parts_;
  // Per r in [0, P): the data set of sample r of a period, and how many of
  // the period's earlier samples went to the same data set.
  std::vector<uint16_t> component_;
  std::vector<uint32_t> rank_;
};

}  // namespace conveyor::engine::data_internal

#endif  // CONVEYOR_ENGINE_INTERNAL_DATA_BLEND_H_
