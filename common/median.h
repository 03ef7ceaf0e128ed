// The median of a sample of timings, as the layer profiler and the trace's
// bubble breakdown take it: the mean of the middle two for an even count, 0
// for none. Header-only; a pure function, thread-safe.
#ifndef CONVEYOR_COMMON_MEDIAN_H_
#define CONVEYOR_COMMON_MEDIAN_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace conveyor {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  if (n == 0) return 0;
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_MEDIAN_H_
