// Counting the series of a Prometheus text scrape, for the tests that check
// a cardinality budget (docs/metrics.md "Cardinality").
#ifndef CONVEYOR_TESTS_TESTING_METRIC_SERIES_H_
#define CONVEYOR_TESTS_TESTING_METRIC_SERIES_H_

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace conveyor::testing_util {

// The series a scrape holds whose line contains `needle` (comment lines
// aside; an empty needle counts them all).
inline int CountSeries(absl::string_view text, absl::string_view needle) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty() && line[0] != '#' && absl::StrContains(line, needle)) {
      ++n;
    }
  }
  return n;
}

}  // namespace conveyor::testing_util

#endif  // CONVEYOR_TESTS_TESTING_METRIC_SERIES_H_
