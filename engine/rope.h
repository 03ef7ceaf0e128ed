// Rotary position embedding's frequencies as HuggingFace transformers
// computes them for each `rope_scaling` type (modeling_rope_utils.py):
// the inverse frequency of every pair of a head's features, and the
// attention factor that scales cos and sin. The Backend's Rope kernel turns
// pairs by them (engine/backend.h).
//
// The tables are computed on the host in float with HF's operation order
// (HF computes inv_freq in float32 from an int64 arange, divides by
// reciprocal-and-multiply where Python's `scalar / tensor` does, compares
// with the scalar rounded to float), so they agree with HF's bit for bit
// wherever the C library's powf agrees with PyTorch's.
//
// Thread-safety: RopeTypeName, CheckRopeScaling and ComputeRopeTable are
// pure; a RopeFrequencyCache is thread-compatible.
#ifndef CONVEYOR_ENGINE_ROPE_H_
#define CONVEYOR_ENGINE_ROPE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/backend.h"

namespace conveyor::engine {

// HF's rope_type values that Conveyor computes.
enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLlama3 };

// "default", "linear", "dynamic", "yarn", "llama3".
absl::string_view RopeTypeName(RopeType type);
// Every name above, in that order: the allowed values in errors.
inline constexpr absl::string_view kRopeTypeNames[] = {
    "default", "linear", "dynamic", "yarn", "llama3"};
// The type named `name`, or nullopt.
std::optional<RopeType> RopeTypeFromName(absl::string_view name);

// HF's rope_scaling (null is kDefault). Each type reads only its fields;
// the others keep their defaults, so that two equal scalings compare equal.
struct RopeScaling {
  RopeType type = RopeType::kDefault;
  // linear: positions are divided by it; dynamic, yarn, llama3: the context
  // extension. >= 1.
  double factor = 1.0;
  // dynamic: the length past which theta grows (HF takes the config's
  // max_position_embeddings); yarn and llama3: the pretraining context
  // length. >= 1 for those three, 0 for the others.
  int64_t original_max_position_embeddings = 0;
  // llama3: wavelengths longer than original / low_freq_factor are divided
  // by factor, shorter than original / high_freq_factor kept, and those
  // between smoothed. 0 < low < high.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // yarn: the rotation counts that bound the ramp from interpolated to
  // extrapolated frequencies (HF's defaults); beta_fast >= beta_slow > 0.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  // yarn: scales cos and sin; unset: 0.1 ln(factor) + 1, or with mscale
  // and mscale_all_dim both nonzero the ratio of those two (DeepSeek's).
  std::optional<double> attention_factor = std::nullopt;
  std::optional<double> mscale = std::nullopt;
  std::optional<double> mscale_all_dim = std::nullopt;
  // yarn: rounds the ramp's ends outwards to whole dimensions (HF's
  // default; gpt-oss turns it off).
  bool truncate = true;

  bool operator==(const RopeScaling&) const = default;
};

// A value out of range: HF's key ("factor", or "head_dim" and "rope_theta"
// for limits that depend on them) and why, for the caller to place (a YAML
// position, a config.json key).
struct RopeScalingProblem {
  std::string key;
  std::string message;
};

// The first value of `scaling` that cannot be computed with, given the
// base `theta` (> 0) and the head size (even, > 0; 0 when not known yet,
// which skips the checks that need it). nullopt when it can.
std::optional<RopeScalingProblem> CheckRopeScaling(const RopeScaling& scaling,
                                                   double theta,
                                                   int64_t head_dim);

// What the kernel turns by.
struct RopeTable {
  // head_dim / 2 values: pair i at position p turns by p * inv_freq[i].
  std::vector<float> inv_freq;
  // Scales cos and sin (HF's attention_scaling).
  float attention_factor = 1.0f;

  bool operator==(const RopeTable&) const = default;
};

// The table of a head of `head_dim` features with base `theta`, for a
// sequence whose positions are below `seq_len`: only kDynamic depends on
// it, growing theta once seq_len passes original_max_position_embeddings
// (HF's dynamic NTK) and equal to kDefault's table otherwise. The
// arguments must pass CheckRopeScaling (a bug otherwise: aborts).
RopeTable ComputeRopeTable(const RopeScaling& scaling, double theta,
                           int64_t head_dim, int64_t seq_len);

// The table of one rotary embedding held on a backend, uploaded once, or
// for kDynamic once per distinct length past the original one (a training
// layer sees one length; a decoder a growing one).
class RopeFrequencyCache {
 public:
  RopeFrequencyCache(const RopeScaling& scaling, double theta, int64_t head_dim)
      : scaling_(scaling), theta_(theta), head_dim_(head_dim) {}

  // The frequencies for a sequence of `seq_len` positions on `backend`.
  // ResourceExhausted (or the backend's error) when the upload fails.
  absl::StatusOr<RopeFrequencies> Get(Backend& backend, int64_t seq_len);

 private:
  RopeScaling scaling_;
  double theta_;
  int64_t head_dim_;
  // The length the cached table was computed for (every length at or
  // below the original one shares a key), and the table on `backend_`.
  int64_t key_ = -1;
  Backend* backend_ = nullptr;
  RopeFrequencies cached_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_ROPE_H_
