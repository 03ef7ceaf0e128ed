// The rope tables (engine/rope.h). Each step below is one PyTorch float32
// operation of HF's code, in its order: a Python scalar meets a float32
// tensor as a float, `scalar / tensor` is tensor.reciprocal() * scalar
// (torch's __rtruediv__), and Python's own arithmetic between scalars stays
// in double. This file is compiled without floating-point contraction
// (engine/CMakeLists.txt): a fused multiply-add would round once where
// PyTorch rounds twice.
#include "engine/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace conveyor::engine {
namespace {

// HF's _compute_default_rope_parameters: 1 / base^(float(2i) / dim).
std::vector<float> DefaultInvFreq(float base, int64_t head_dim) {
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float exponent =
        static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }
  return inv_freq;
}

// _compute_dynamic_ntk_parameters past the original length. HF passes the
// length as an int64 tensor (max(position_ids) + 1), so the grown base is
// a float32 computation too.
std::vector<float> DynamicInvFreq(const RopeScaling& s, double theta,
                                  int64_t head_dim, int64_t seq_len) {
  float t = static_cast<float>(s.factor) * static_cast<float>(seq_len);
  t = t / static_cast<float>(s.original_max_position_embeddings);
  t = t - static_cast<float>(s.factor - 1.0);
  const double exponent =
      static_cast<double>(head_dim) / static_cast<double>(head_dim - 2);
  t = std::pow(t, static_cast<float>(exponent));
  return DefaultInvFreq(static_cast<float>(theta) * t, head_dim);
}

// _compute_llama3_parameters: long wavelengths divided by factor, short
// ones kept, the band between smoothed.
std::vector<float> Llama3InvFreq(const RopeScaling& s, double theta,
                                 int64_t head_dim) {
  std::vector<float> inv_freq =
      DefaultInvFreq(static_cast<float>(theta), head_dim);
  const double original =
      static_cast<double>(s.original_max_position_embeddings);
  // Python scalars, compared with float32 tensors as floats.
  const float low_wavelen = static_cast<float>(original / s.low_freq_factor);
  const float high_wavelen = static_cast<float>(original / s.high_freq_factor);
  const float two_pi = static_cast<float>(2 * std::numbers::pi);
  const float factor = static_cast<float>(s.factor);
  const float original_f = static_cast<float>(original);
  const float low = static_cast<float>(s.low_freq_factor);
  const float band = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  for (float& f : inv_freq) {
    const float wavelen = (1.0f / f) * two_pi;
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const float smooth = ((1.0f / wavelen) * original_f - low) / band;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f = medium ? smoothed : scaled;
  }
  return inv_freq;
}

// get_mscale in HF's _compute_yarn_parameters.
double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// HF's attention factor for yarn: the configured one, DeepSeek's ratio of
// mscales when both are nonzero, else get_mscale(factor).
double YarnAttentionFactor(const RopeScaling& s) {
  if (s.attention_factor.has_value()) return *s.attention_factor;
  if (s.mscale.value_or(0.0) != 0.0 && s.mscale_all_dim.value_or(0.0) != 0.0) {
    return YarnMscale(s.factor, *s.mscale) /
           YarnMscale(s.factor, *s.mscale_all_dim);
  }
  return YarnMscale(s.factor, 1.0);
}

// _compute_yarn_parameters: a ramp over the dimensions from interpolated
// (divided by factor) to extrapolated (kept) frequencies.
RopeTable YarnTable(const RopeScaling& s, double theta, int64_t head_dim) {
  RopeTable table;
  table.attention_factor = static_cast<float>(YarnAttentionFactor(s));

  const double dim = static_cast<double>(head_dim);
  const double original =
      static_cast<double>(s.original_max_position_embeddings);
  // The dimension at which a frequency completes `rotations` turns over the
  // original length (Python doubles, as HF's find_correction_dim).
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(theta));
  };
  double low = correction_dim(s.beta_fast);
  double high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // HF's guard against a zero-width ramp.
  const float low_f = static_cast<float>(low);
  const float width = static_cast<float>(high - low);
  const float factor = static_cast<float>(s.factor);
  const float base = static_cast<float>(theta);

  table.inv_freq.resize(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < table.inv_freq.size(); ++i) {
    const float pos_freq =
        std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp =
        std::clamp((static_cast<float>(i) - low_f) / width, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    table.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) +
                        extrapolation * extrapolation_factor;
  }
  return table;
}

bool Finite(double v) { return std::isfinite(v); }

}  // namespace

absl::string_view RopeTypeName(RopeType type) {
  return kRopeTypeNames[static_cast<int>(type)];
}

std::optional<RopeType> RopeTypeFromName(absl::string_view name) {
  for (int i = 0; i < static_cast<int>(std::size(kRopeTypeNames)); ++i) {
    if (kRopeTypeNames[i] == name) return static_cast<RopeType>(i);
  }
  return std::nullopt;
}

std::optional<RopeScalingProblem> CheckRopeScaling(const RopeScaling& s,
                                                   double theta,
                                                   int64_t head_dim) {
  auto problem = [](absl::string_view key, auto&&... message) {
    return std::optional<RopeScalingProblem>(
        RopeScalingProblem{std::string(key), absl::StrCat(message...)});
  };
  if (!(theta > 0.0 && Finite(theta))) {
    return problem("rope_theta", "must be positive and finite; got ", theta);
  }
  if (s.type == RopeType::kDefault) return std::nullopt;
  const absl::string_view type = RopeTypeName(s.type);
  if (!(s.factor >= 1.0 && Finite(s.factor))) {
    return problem("factor", "must be a finite number >= 1 for rope_type ",
                   type, "; got ", s.factor);
  }
  if (s.type == RopeType::kLinear) return std::nullopt;
  if (s.original_max_position_embeddings < 1) {
    return problem("original_max_position_embeddings",
                   "must be a positive integer for rope_type ", type, "; got ",
                   s.original_max_position_embeddings);
  }
  switch (s.type) {
    case RopeType::kDynamic:
      // HF raises the base to dim / (dim - 2).
      if (head_dim != 0 && head_dim <= 2) {
        return problem("head_dim", "must be more than 2 for rope_type ", type,
                       "; got ", head_dim);
      }
      break;
    case RopeType::kLlama3:
      if (!(s.low_freq_factor > 0.0 && Finite(s.low_freq_factor))) {
        return problem("low_freq_factor", "must be positive and finite; got ",
                       s.low_freq_factor);
      }
      if (!(s.high_freq_factor > s.low_freq_factor &&
            Finite(s.high_freq_factor))) {
        return problem("high_freq_factor",
                       "must be finite and more than low_freq_factor (",
                       s.low_freq_factor, "); got ", s.high_freq_factor);
      }
      break;
    case RopeType::kYarn:
      // The correction range divides by log(theta).
      if (theta <= 1.0) {
        return problem("rope_theta", "must be more than 1 for rope_type ", type,
                       "; got ", theta);
      }
      if (!(s.beta_slow > 0.0 && Finite(s.beta_slow))) {
        return problem("beta_slow", "must be positive and finite; got ",
                       s.beta_slow);
      }
      if (!(s.beta_fast >= s.beta_slow && Finite(s.beta_fast))) {
        return problem("beta_fast", "must be finite and at least beta_slow (",
                       s.beta_slow, "); got ", s.beta_fast);
      }
      if (s.attention_factor.has_value() &&
          !(*s.attention_factor > 0.0 && Finite(*s.attention_factor))) {
        return problem("attention_factor", "must be positive and finite; got ",
                       *s.attention_factor);
      }
      for (const auto& [key, value] :
           {std::pair{"mscale", s.mscale},
            std::pair{"mscale_all_dim", s.mscale_all_dim}}) {
        if (value.has_value() && !Finite(*value)) {
          return problem(key, "must be finite; got ", *value);
        }
      }
      if (const double a = YarnAttentionFactor(s); !(a > 0.0 && Finite(a))) {
        return problem("mscale",
                       "mscale and mscale_all_dim give the attention factor ",
                       a, "; it must be positive and finite");
      }
      break;
    default:
      break;
  }
  return std::nullopt;
}

RopeTable ComputeRopeTable(const RopeScaling& scaling, double theta,
                           int64_t head_dim, int64_t seq_len) {
  CONVEYOR_CHECK(head_dim > 0 && head_dim % 2 == 0,
                 "rope needs an even, positive head_dim");
  CONVEYOR_CHECK(!CheckRopeScaling(scaling, theta, head_dim).has_value(),
                 "rope scaling out of range");
  RopeTable table;
  switch (scaling.type) {
    case RopeType::kDefault:
      table.inv_freq = DefaultInvFreq(static_cast<float>(theta), head_dim);
      break;
    case RopeType::kLinear:
      table.inv_freq = DefaultInvFreq(static_cast<float>(theta), head_dim);
      for (float& f : table.inv_freq) f /= static_cast<float>(scaling.factor);
      break;
    case RopeType::kDynamic:
      // At or below the original length HF keeps the table it computed at
      // init, whose grown base is base * 1 (in double): the default one.
      table.inv_freq =
          seq_len > scaling.original_max_position_embeddings
              ? DynamicInvFreq(scaling, theta, head_dim, seq_len)
              : DefaultInvFreq(static_cast<float>(theta), head_dim);
      break;
    case RopeType::kYarn:
      table = YarnTable(scaling, theta, head_dim);
      break;
    case RopeType::kLlama3:
      table.inv_freq = Llama3InvFreq(scaling, theta, head_dim);
      break;
  }
  return table;
}

absl::StatusOr<RopeFrequencies> RopeFrequencyCache::Get(Backend& backend,
                                                        int64_t seq_len) {
  const int64_t key =
      scaling_.type == RopeType::kDynamic
          ? std::max(seq_len, scaling_.original_max_position_embeddings)
          : 0;
  if (key == key_ && &backend == backend_) return cached_;
  const RopeTable table = ComputeRopeTable(scaling_, theta_, head_dim_, key);
  const int64_t n = static_cast<int64_t>(table.inv_freq.size());
  ASSIGN_OR_RETURN(Tensor inv_freq, backend.Empty({n}, DType::kF32));
  RETURN_IF_ERROR(backend.CopyFromHost(
      table.inv_freq.data(), table.inv_freq.size() * sizeof(float), inv_freq));
  cached_ = {.inv_freq = inv_freq, .attention_factor = table.attention_factor};
  key_ = key;
  backend_ = &backend;
  return cached_;
}

}  // namespace conveyor::engine
