// BlendSchedule (engine/internal/data_blend.h).
#include "engine/internal/data_blend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace conveyor::engine::data_internal {
namespace {

// Building the table costs P x K steps; this keeps it well under a second.
constexpr int64_t kMaxTableWork = int64_t{1} << 28;

// The weights as exact integers: scaled by the smallest power of ten (up to
// 10^6) that makes every one whole with a sum of at most `resolution`, so
// that the 0.3 and 0.7 a user writes mean exactly 3 : 7; otherwise rounded
// to parts of `resolution`, each at least 1.
std::vector<int64_t> IntegerWeights(absl::Span<const double> weights,
                                    int64_t resolution) {
  double scale = 1;
  for (int digits = 0; digits <= 6; ++digits, scale *= 10) {
    std::vector<int64_t> parts;
    double sum = 0;
    for (const double w : weights) {
      const double scaled = w * scale;
      const double whole = std::round(scaled);
      if (whole < 1 || std::abs(scaled - whole) > 1e-9 * whole) break;
      sum += whole;
      parts.push_back(static_cast<int64_t>(whole));
    }
    if (parts.size() == weights.size() &&
        sum <= static_cast<double>(resolution)) {
      return parts;
    }
  }
  double total = 0;
  for (const double w : weights) total += w;
  std::vector<int64_t> parts;
  for (const double w : weights) {
    parts.push_back(std::max<int64_t>(
        1, std::llround(w / total * static_cast<double>(resolution))));
  }
  return parts;
}

}  // namespace

absl::StatusOr<BlendSchedule> BlendSchedule::Create(
    absl::Span<const double> weights) {
  if (weights.size() < 2 || weights.size() > kMaxBlendEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.blend must list 2 to ", kMaxBlendEntries, " data sets, got ",
        weights.size(), weights.size() == 1 ? " (give one as data.path)" : ""));
  }
  for (size_t k = 0; k < weights.size(); ++k) {
    if (!std::isfinite(weights[k]) || weights[k] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.blend[", k, "].weight must be a finite positive number, got ",
          weights[k]));
    }
  }
  BlendSchedule schedule;
  const int64_t k_count = static_cast<int64_t>(weights.size());
  schedule.parts_ = IntegerWeights(
      weights, std::min(kBlendResolution, kMaxTableWork / k_count));
  int64_t divisor = 0;
  for (const int64_t a : schedule.parts_) divisor = std::gcd(divisor, a);
  int64_t period = 0;
  for (int64_t& a : schedule.parts_) {
    a /= divisor;
    period += a;
  }
  // Megatron's greedy rule with both sides times P, so it is exact: sample
  // r goes to the k with the largest a_k (r + 1) - P c_k, the first on a
  // tie. Over a period every deficit returns to 0 (each data set k gets
  // exactly a_k samples), so the rule repeats with period P.
  const size_t n = schedule.parts_.size();
  std::vector<int64_t> taken(n, 0);
  schedule.component_.resize(static_cast<size_t>(period));
  schedule.rank_.resize(static_cast<size_t>(period));
  for (int64_t r = 0; r < period; ++r) {
    size_t best = 0;
    int64_t best_deficit = INT64_MIN;
    for (size_t k = 0; k < n; ++k) {
      const int64_t deficit = schedule.parts_[k] * (r + 1) - period * taken[k];
      if (deficit > best_deficit) {
        best = k;
        best_deficit = deficit;
      }
    }
    schedule.component_[r] = static_cast<uint16_t>(best);
    schedule.rank_[r] = static_cast<uint32_t>(taken[best]);
    ++taken[best];
  }
  // Locate relies on whole periods giving a_k each; the rule guarantees it,
  // so this only guards the arithmetic.
  for (size_t k = 0; k < n; ++k) {
    if (taken[k] != schedule.parts_[k]) {
      return absl::InternalError(absl::StrCat(
          "data.blend: data set ", k, " got ", taken[k], " of a period of ",
          period, " samples instead of ", schedule.parts_[k]));
    }
  }
  return schedule;
}

}  // namespace conveyor::engine::data_internal
