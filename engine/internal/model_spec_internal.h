// What the model spec's parser (engine/model_spec_parser.cc) and its
// assembly (engine/model_spec.cc) share: the capped element count both use
// to hold shapes to kMaxSampleElements without overflowing.
//
// Not API: only engine/model_spec*.cc include this. Pure functions:
// thread-safe.
#ifndef CONVEYOR_ENGINE_INTERNAL_MODEL_SPEC_INTERNAL_H_
#define CONVEYOR_ENGINE_INTERNAL_MODEL_SPEC_INTERNAL_H_

#include <cstdint>
#include <vector>

namespace conveyor::engine::model_spec_internal {

// Product of `shape`, or `limit` + 1 once it exceeds `limit` (so that a rank-8
// shape of huge dimensions cannot overflow).
inline int64_t ElementsCapped(const std::vector<int64_t>& shape,
                              int64_t limit) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > limit / d) return limit + 1;
    n *= d;
  }
  return n;
}

}  // namespace conveyor::engine::model_spec_internal

#endif  // CONVEYOR_ENGINE_INTERNAL_MODEL_SPEC_INTERNAL_H_
