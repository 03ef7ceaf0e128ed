// Parameter initialization that depends only on the seed and the parameter's
// global name, never on how the model is split: element i of parameter "n"
// is a pure function of (seed, n, i), drawn with a counter-based generator.
// So a 1-stage and a 4-stage job start from identical weights. Distributions
// are PyTorch's defaults (the model spec resolves bounds and deviations);
// values are not PyTorch's, since torch's generator is not ours.
// Thread-safe.
#ifndef CONVEYOR_ENGINE_INIT_H_
#define CONVEYOR_ENGINE_INIT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/backend.h"

namespace conveyor::engine {

struct InitRule {
  enum class Kind { kUniform, kNormal, kOnes, kZeros };
  Kind kind = Kind::kZeros;
  double scale = 0;  // Uniform: values in [-scale, scale). Normal: std dev.
};

// Fills the f32 tensor `value` by `rule`, deterministically from (seed, name).
absl::Status InitializeParameter(Backend* backend, uint64_t seed,
                                 absl::string_view name, const InitRule& rule,
                                 const Tensor& value);

// The i-th uniform draw in [0, 1) of the stream for (seed, name); exposed for
// tests and for data sources that need the same determinism.
double UniformDraw(uint64_t seed, absl::string_view name, uint64_t i);
// The i-th standard normal draw of the stream for (seed, name).
double NormalDraw(uint64_t seed, absl::string_view name, uint64_t i);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_INIT_H_
