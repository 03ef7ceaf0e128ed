#include "hf/config.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "nlohmann/json.hpp"

namespace conveyor::hf {
namespace {

using Json = nlohmann::json;
// Keeps keys in insertion order, so the written config.json reads like the
// ones on the Hub (architectures first).
using OrderedJson = nlohmann::ordered_json;

// HF configs nest a few levels (rope_scaling, quantization_config,
// id2label); the cap only keeps a hostile "[[[[..." away from recursion.
constexpr int kMaxJsonDepth = 16;

// MistralConfig's default window: a Mistral config.json without the key
// uses sliding-window attention.
constexpr int64_t kMistralDefaultSlidingWindow = 4096;

absl::Status KeyError(absl::string_view source, absl::string_view key,
                      absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": ", key, ": ", message));
}

// A short, printable rendition of a JSON value for error messages.
std::string Describe(const Json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true,
                                Json::error_handler_t::replace);
  if (text.size() > 64) text = absl::StrCat(text.substr(0, 61), "...");
  return text;
}

std::string RangeMessage(int64_t min, int64_t max) {
  return absl::StrCat("must be an integer in [", min, ", ", max, "]");
}

// Reads the keys of config.json's top-level object. Keys it is not asked
// for are ignored: HF configs carry many that do not concern the weights.
class ConfigReader {
 public:
  ConfigReader(const Json& object, absl::string_view source)
      : object_(object), source_(source) {}

  absl::Status Error(absl::string_view key, absl::string_view message) const {
    return KeyError(source_, key, message);
  }

  // nullptr when the key is absent or null: transformers treats both the
  // same (the parameter's default, or None).
  const Json* Find(absl::string_view key) const {
    auto it = object_.find(std::string(key));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<int64_t> Int(absl::string_view key, int64_t min,
                              int64_t max) const {
    const Json* value = Find(key);
    if (value == nullptr) {
      // Distinguish an explicit null from a missing key in the message.
      if (object_.contains(std::string(key))) {
        return Error(key, absl::StrCat(RangeMessage(min, max), "; got null"));
      }
      return Error(key, "missing");
    }
    return IntValue(key, *value, min, max);
  }

  absl::StatusOr<int64_t> OptionalInt(absl::string_view key, int64_t min,
                                      int64_t max, int64_t fallback) const {
    const Json* value = Find(key);
    if (value == nullptr) return fallback;
    return IntValue(key, *value, min, max);
  }

  absl::StatusOr<double> OptionalNumber(absl::string_view key,
                                        double fallback) const {
    const Json* value = Find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number()) {
      return Error(key,
                   absl::StrCat("must be a number; got ", Describe(*value)));
    }
    return value->get<double>();
  }

  absl::StatusOr<bool> OptionalBool(absl::string_view key,
                                    bool fallback) const {
    const Json* value = Find(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) {
      return Error(
          key, absl::StrCat("must be true or false; got ", Describe(*value)));
    }
    return value->get<bool>();
  }

  absl::StatusOr<std::string> OptionalString(absl::string_view key,
                                             absl::string_view fallback) const {
    const Json* value = Find(key);
    if (value == nullptr) return std::string(fallback);
    if (!value->is_string()) {
      return Error(key,
                   absl::StrCat("must be a string; got ", Describe(*value)));
    }
    return value->get<std::string>();
  }

 private:
  absl::StatusOr<int64_t> IntValue(absl::string_view key, const Json& value,
                                   int64_t min, int64_t max) const {
    // 2048.0 is not an integer to transformers either (it would build
    // tensors with a float size and fail).
    bool in_range = false;
    if (value.is_number_unsigned()) {
      in_range = value.get<uint64_t>() <= static_cast<uint64_t>(max) &&
                 static_cast<int64_t>(value.get<uint64_t>()) >= min;
    } else if (value.is_number_integer()) {
      in_range = value.get<int64_t>() >= min && value.get<int64_t>() <= max;
    }
    if (!in_range) {
      return Error(
          key, absl::StrCat(RangeMessage(min, max), "; got ", Describe(value)));
    }
    return value.get<int64_t>();
  }

  const Json& object_;
  absl::string_view source_;
};

std::string SupportedArchitectures() {
  return absl::StrCat(kLlamaArchitecture, ", ", kMistralArchitecture, ", ",
                      kQwen2Architecture);
}

absl::Status UnsupportedArchitecture(absl::string_view source,
                                     absl::string_view shown) {
  return KeyError(source, "architectures",
                  absl::StrCat("unsupported ", shown,
                               "; supported: ", SupportedArchitectures()));
}

// "architectures": a list of exactly one supported name.
absl::StatusOr<std::string> ParseArchitecture(const ConfigReader& reader,
                                              absl::string_view source) {
  const Json* value = reader.Find("architectures");
  if (value == nullptr) {
    return reader.Error(
        "architectures",
        absl::StrCat("missing; supported: ", SupportedArchitectures()));
  }
  if (!value->is_array() || value->size() != 1 || !(*value)[0].is_string()) {
    return reader.Error(
        "architectures",
        absl::StrCat("must be a list of one architecture name; got ",
                     Describe(*value)));
  }
  std::string architecture = (*value)[0].get<std::string>();
  if (ModelTypeFor(architecture).empty()) {
    return UnsupportedArchitecture(source, Describe((*value)[0]));
  }
  return architecture;
}

}  // namespace

absl::string_view TorchDTypeName(HfDType dtype) {
  return dtype == HfDType::kBF16 ? "bfloat16" : "float32";
}

absl::string_view ModelTypeFor(absl::string_view architecture) {
  if (architecture == kLlamaArchitecture) return "llama";
  if (architecture == kMistralArchitecture) return "mistral";
  if (architecture == kQwen2Architecture) return "qwen2";
  return "";
}

absl::Status ValidateHfLlamaConfig(const HfLlamaConfig& config,
                                   absl::string_view source) {
  const absl::string_view model_type = ModelTypeFor(config.architecture);
  if (model_type.empty()) {
    return UnsupportedArchitecture(
        source, absl::StrCat("\"", config.architecture, "\""));
  }
  if (config.model_type != model_type) {
    return KeyError(
        source, "model_type",
        absl::StrCat("must be \"", model_type, "\" for ", config.architecture,
                     "; got \"", config.model_type, "\""));
  }
  const std::pair<absl::string_view, int64_t> sizes[] = {
      {"hidden_size", config.hidden_size},
      {"intermediate_size", config.intermediate_size},
      {"num_hidden_layers", config.num_hidden_layers},
      {"num_attention_heads", config.num_attention_heads},
      {"num_key_value_heads", config.num_key_value_heads},
      {"vocab_size", config.vocab_size},
      {"max_position_embeddings", config.max_position_embeddings},
  };
  for (const auto& [key, size] : sizes) {
    if (size < 1 || size > kMaxHfDimension) {
      return KeyError(
          source, key,
          absl::StrCat(RangeMessage(1, kMaxHfDimension), "; got ", size));
    }
  }
  if (config.hidden_size % config.num_attention_heads != 0) {
    return KeyError(
        source, "num_attention_heads",
        absl::StrCat("must divide hidden_size = ", config.hidden_size, "; got ",
                     config.num_attention_heads));
  }
  // Rotary embedding rotates pairs of a head's features.
  if (config.head_dim() % 2 != 0) {
    return KeyError(
        source, "num_attention_heads",
        absl::StrCat("gives an odd head size ", config.head_dim(),
                     " (hidden_size ", config.hidden_size, " / ",
                     config.num_attention_heads,
                     " heads); rotary embedding needs an even one"));
  }
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return KeyError(source, "num_key_value_heads",
                    absl::StrCat("must divide num_attention_heads = ",
                                 config.num_attention_heads, "; got ",
                                 config.num_key_value_heads));
  }
  if (!(config.rms_norm_eps > 0.0 && config.rms_norm_eps < 1.0)) {
    return KeyError(
        source, "rms_norm_eps",
        absl::StrCat("must be in (0, 1); got ", config.rms_norm_eps));
  }
  if (!(config.rope_theta > 0.0 && std::isfinite(config.rope_theta))) {
    return KeyError(
        source, "rope_theta",
        absl::StrCat("must be positive and finite; got ", config.rope_theta));
  }
  if (config.hidden_act != "silu") {
    return KeyError(
        source, "hidden_act",
        absl::StrCat("must be \"silu\"; got \"", config.hidden_act, "\""));
  }
  const bool qwen2 = config.architecture == kQwen2Architecture;
  if (config.attention_bias != qwen2) {
    return KeyError(
        source, "attention_bias",
        qwen2 ? absl::StrCat("must be true for ", config.architecture,
                             " (its q/k/v projections always have biases); "
                             "got false")
              : absl::StrCat("must be false for ", config.architecture,
                             config.architecture == kLlamaArchitecture
                                 ? " (it would add an o_proj bias, which "
                                   "Conveyor's llama_block does not have)"
                                 : "",
                             "; got true"));
  }
  return absl::OkStatus();
}

absl::StatusOr<HfLlamaConfig> ParseHfLlamaConfig(absl::string_view json_text,
                                                 absl::string_view file_name) {
  ASSIGN_OR_RETURN(
      const Json json,
      ParseStrictJson(json_text, file_name, {.max_depth = kMaxJsonDepth}));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file_name, ": must be a JSON object; got ", json.type_name()));
  }
  const ConfigReader r(json, file_name);
  HfLlamaConfig c;
  ASSIGN_OR_RETURN(c.architecture, ParseArchitecture(r, file_name));
  ASSIGN_OR_RETURN(
      c.model_type,
      r.OptionalString("model_type", ModelTypeFor(c.architecture)));
  constexpr int64_t kMax = kMaxHfDimension;
  ASSIGN_OR_RETURN(c.hidden_size, r.Int("hidden_size", 1, kMax));
  ASSIGN_OR_RETURN(c.intermediate_size, r.Int("intermediate_size", 1, kMax));
  ASSIGN_OR_RETURN(c.num_hidden_layers, r.Int("num_hidden_layers", 1, kMax));
  ASSIGN_OR_RETURN(c.num_attention_heads,
                   r.Int("num_attention_heads", 1, kMax));
  ASSIGN_OR_RETURN(
      c.num_key_value_heads,
      r.OptionalInt("num_key_value_heads", 1, kMax, c.num_attention_heads));
  ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", 1, kMax));
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   r.Int("max_position_embeddings", 1, kMax));
  ASSIGN_OR_RETURN(c.rms_norm_eps, r.OptionalNumber("rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.rope_theta, r.OptionalNumber("rope_theta", 10000.0));
  ASSIGN_OR_RETURN(c.tie_word_embeddings,
                   r.OptionalBool("tie_word_embeddings", false));
  ASSIGN_OR_RETURN(c.hidden_act, r.OptionalString("hidden_act", "silu"));
  const bool qwen2 = c.architecture == kQwen2Architecture;
  ASSIGN_OR_RETURN(c.attention_bias, r.OptionalBool("attention_bias", qwen2));

  // Keys the struct does not keep, because only one value is supported.
  if (const Json* v = r.Find("rope_scaling"); v != nullptr) {
    return r.Error("rope_scaling",
                   absl::StrCat("must be null (RoPE scaling is not "
                                "supported); got ",
                                Describe(*v)));
  }
  ASSIGN_OR_RETURN(const bool mlp_bias, r.OptionalBool("mlp_bias", false));
  if (mlp_bias) {
    return r.Error("mlp_bias",
                   "must be false (MLP biases are not supported); got true");
  }
  if (c.architecture == kMistralArchitecture) {
    if (!json.contains("sliding_window")) {
      return r.Error(
          "sliding_window",
          absl::StrCat("must be null (sliding-window attention is not "
                       "supported); missing means MistralConfig's default "
                       "of ",
                       kMistralDefaultSlidingWindow));
    }
    if (const Json* v = r.Find("sliding_window"); v != nullptr) {
      return r.Error("sliding_window",
                     absl::StrCat("must be null (sliding-window attention is "
                                  "not supported); got ",
                                  Describe(*v)));
    }
  }
  if (qwen2) {
    // Qwen2 ignores sliding_window unless use_sliding_window is set.
    ASSIGN_OR_RETURN(const bool use_sliding_window,
                     r.OptionalBool("use_sliding_window", false));
    if (use_sliding_window) {
      return r.Error("use_sliding_window",
                     "must be false (sliding-window attention is not "
                     "supported); got true");
    }
  }
  RETURN_IF_ERROR(ValidateHfLlamaConfig(c, file_name));
  // After validation: the head size is only meaningful once the heads
  // divide hidden_size.
  ASSIGN_OR_RETURN(const int64_t head_dim,
                   r.OptionalInt("head_dim", 1, kMax, c.head_dim()));
  if (head_dim != c.head_dim()) {
    return r.Error("head_dim",
                   absl::StrCat("must be hidden_size / num_attention_heads = ",
                                c.head_dim(), "; got ", head_dim));
  }
  return c;
}

std::string HfLlamaConfigJson(const HfLlamaConfig& config, HfDType dtype) {
  OrderedJson j;
  j["architectures"] = OrderedJson::array({config.architecture});
  j["model_type"] = config.model_type;
  j["hidden_size"] = config.hidden_size;
  j["intermediate_size"] = config.intermediate_size;
  j["num_hidden_layers"] = config.num_hidden_layers;
  j["num_attention_heads"] = config.num_attention_heads;
  j["num_key_value_heads"] = config.num_key_value_heads;
  j["head_dim"] = config.head_dim();
  j["hidden_act"] = config.hidden_act;
  j["rms_norm_eps"] = config.rms_norm_eps;
  j["rope_theta"] = config.rope_theta;
  j["rope_scaling"] = nullptr;
  j["vocab_size"] = config.vocab_size;
  j["max_position_embeddings"] = config.max_position_embeddings;
  j["tie_word_embeddings"] = config.tie_word_embeddings;
  if (config.architecture == kLlamaArchitecture) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  } else if (config.architecture == kMistralArchitecture) {
    j["sliding_window"] = nullptr;
  } else if (config.architecture == kQwen2Architecture) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  j["initializer_range"] = 0.02;
  j["torch_dtype"] = std::string(TorchDTypeName(dtype));
  return j.dump(2) + "\n";
}

}  // namespace conveyor::hf
