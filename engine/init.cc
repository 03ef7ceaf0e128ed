#include "engine/init.h"

#include <cmath>
#include <new>
#include <numbers>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cancellation.h"
#include "common/status_macros.h"

namespace conveyor::engine {
namespace {

// SplitMix64: a strong 64-bit mixer; applied to a counter it gives an
// independent-looking stream that can be entered at any index.
uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t StreamKey(uint64_t seed, absl::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a over the name.
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return Mix(seed ^ Mix(h));
}

double ToUnit(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
}

double Uniform(uint64_t key, uint64_t i) { return ToUnit(Mix(key + Mix(i))); }

double Normal(uint64_t key, uint64_t i) {
  // Box-Muller on two draws of their own sub-stream; 1 - u keeps log finite.
  const double u1 = 1.0 - Uniform(key, 2 * i);
  const double u2 = Uniform(key, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// About a millisecond of draws between two looks at the job's cancellation.
constexpr int64_t kCancelCheckElements = int64_t{1} << 16;

}  // namespace

double UniformDraw(uint64_t seed, absl::string_view name, uint64_t i) {
  return Uniform(StreamKey(seed, name), i);
}

double NormalDraw(uint64_t seed, absl::string_view name, uint64_t i) {
  return Normal(StreamKey(seed, name), i);
}

absl::Status InitializeParameter(Backend* backend, uint64_t seed,
                                 absl::string_view name, const InitRule& rule,
                                 const Tensor& value) {
  const int64_t n = value.numel();
  std::vector<float> host;
  try {
    host.resize(n);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "init of ", name, ": not enough host memory for ", n, " floats"));
  }
  const uint64_t key = StreamKey(seed, name);
  for (int64_t i = 0; i < n; ++i) {
    // A billion draws take tens of seconds: a cancelled job stops here
    // (common/cancellation.h) instead of finishing them.
    if (i % kCancelCheckElements == 0) RETURN_IF_ERROR(CheckCancelled());
    switch (rule.kind) {
      case InitRule::Kind::kUniform:
        host[i] =
            static_cast<float>((2.0 * Uniform(key, i) - 1.0) * rule.scale);
        break;
      case InitRule::Kind::kNormal:
        host[i] = static_cast<float>(Normal(key, i) * rule.scale);
        break;
      case InitRule::Kind::kOnes:
        host[i] = 1.0f;
        break;
      case InitRule::Kind::kZeros:
        host[i] = 0.0f;
        break;
    }
  }
  return backend->CopyFromHost(host.data(), host.size() * sizeof(float), value);
}

}  // namespace conveyor::engine
