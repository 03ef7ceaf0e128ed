#include "hf/config.h"

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "hf/internal/config_json.h"
#include "nlohmann/json.hpp"

namespace conveyor::hf {
namespace {

using config_internal::ConfigReader;
using config_internal::Describe;
using config_internal::Json;
using config_internal::KeyError;
using config_internal::OrderedJson;
using config_internal::RangeMessage;

// HF configs nest a few levels (rope_scaling, quantization_config,
// id2label); the cap only keeps a hostile "[[[[..." away from recursion.
constexpr int kMaxJsonDepth = 16;

// MistralConfig's default window: a Mistral config.json without the key
// uses sliding-window attention.
constexpr int64_t kMistralDefaultSlidingWindow = 4096;

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

bool HfLlamaConfig::operator==(const HfLlamaConfig& other) const {
  auto model = [](const HfLlamaConfig& c) {
    return std::tie(
        c.architecture, c.model_type, c.hidden_size, c.intermediate_size,
        c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
        c.rms_norm_eps, c.rope_theta, c.rope_scaling, c.explicit_head_dim,
        c.vocab_size, c.max_position_embeddings, c.tie_word_embeddings,
        c.attention_bias, c.hidden_act, c.token_ids);
  };
  return model(*this) == model(other);
}

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
  if (config.explicit_head_dim != 0) {
    // Rotary embedding rotates pairs of a head's features.
    if (config.explicit_head_dim < 0 || config.explicit_head_dim % 2 != 0 ||
        config.explicit_head_dim * config.num_attention_heads >
            kMaxHfDimension) {
      return KeyError(
          source, "head_dim",
          absl::StrCat("must be even, positive, and at most ", kMaxHfDimension,
                       " times num_attention_heads; got ",
                       config.explicit_head_dim));
    }
  } else if (config.hidden_size % config.num_attention_heads != 0) {
    return KeyError(
        source, "num_attention_heads",
        absl::StrCat("must divide hidden_size = ", config.hidden_size,
                     " (or head_dim must be given); got ",
                     config.num_attention_heads));
  } else if (config.head_dim() % 2 != 0) {
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
  if (const std::optional<engine::RopeScalingProblem> problem =
          engine::CheckRopeScaling(config.rope_scaling, config.rope_theta,
                                   config.head_dim())) {
    const bool top_level =
        problem->key == "rope_theta" || problem->key == "head_dim";
    return KeyError(
        source,
        top_level ? problem->key : absl::StrCat("rope_scaling.", problem->key),
        problem->message);
  }
  if (config.rope_scaling.type == engine::RopeType::kDynamic &&
      config.rope_scaling.original_max_position_embeddings !=
          config.max_position_embeddings) {
    return KeyError(
        source, "rope_scaling.original_max_position_embeddings",
        absl::StrCat("must equal max_position_embeddings (",
                     config.max_position_embeddings,
                     ") for rope_type dynamic, whose theta HF grows past "
                     "max_position_embeddings; got ",
                     config.rope_scaling.original_max_position_embeddings));
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

  ASSIGN_OR_RETURN(c.explicit_head_dim, r.OptionalInt("head_dim", 1, kMax, 0));
  // Kept only where it says something hidden_size / heads does not.
  if (c.hidden_size % c.num_attention_heads == 0 &&
      c.explicit_head_dim == c.hidden_size / c.num_attention_heads) {
    c.explicit_head_dim = 0;
  }
  RETURN_IF_ERROR(config_internal::ParseRope(r, file_name, c));
  RETURN_IF_ERROR(config_internal::ParseTokenIds(r, c.token_ids));
  ASSIGN_OR_RETURN(c.torch_dtype, r.OptionalString("torch_dtype", ""));

  // Keys the struct does not keep, because only one value is supported.
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
  j["rope_scaling"] = config_internal::RopeScalingJson(config);
  j["vocab_size"] = config.vocab_size;
  j["max_position_embeddings"] = config.max_position_embeddings;
  j["tie_word_embeddings"] = config.tie_word_embeddings;
  const engine::SpecialTokenIds& ids = config.token_ids;
  if (ids.bos.has_value()) j["bos_token_id"] = *ids.bos;
  if (ids.eos_is_list) {
    j["eos_token_id"] = ids.eos;
  } else if (!ids.eos.empty()) {
    j["eos_token_id"] = ids.eos.front();
  }
  if (ids.pad.has_value()) j["pad_token_id"] = *ids.pad;
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
