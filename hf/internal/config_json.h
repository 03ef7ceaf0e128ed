// The JSON side of config.json that hf/config.cc and hf/config_keys.cc
// share: errors that name the key ("<source>: <key>: <why>"), the reader of
// one object's keys, and the readers and writers of the nested keys
// (rope_scaling, the special token ids).
//
// Not API: only hf/config*.cc include this. Pure functions; a ConfigReader
// reads a JSON value it does not own.
#ifndef CONVEYOR_HF_INTERNAL_CONFIG_JSON_H_
#define CONVEYOR_HF_INTERNAL_CONFIG_JSON_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/model_spec.h"
#include "hf/config.h"
#include "nlohmann/json.hpp"

namespace conveyor::hf::config_internal {

using Json = nlohmann::json;
// Keeps keys in insertion order, so the written config.json reads like the
// ones on the Hub (architectures first).
using OrderedJson = nlohmann::ordered_json;

inline absl::Status KeyError(absl::string_view source, absl::string_view key,
                             absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": ", key, ": ", message));
}

// A short, printable rendition of a JSON value for error messages.
inline std::string Describe(const Json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true,
                                Json::error_handler_t::replace);
  if (text.size() > 64) text = absl::StrCat(text.substr(0, 61), "...");
  return text;
}

inline std::string RangeMessage(int64_t min, int64_t max) {
  return absl::StrCat("must be an integer in [", min, ", ", max, "]");
}

// Reads the keys of config.json's top-level object. Keys it is not asked
// for are ignored: HF configs carry many that do not concern the weights.
class ConfigReader {
 public:
  // `prefix` goes before every key in errors ("rope_scaling." for the keys
  // of that object).
  ConfigReader(const Json& object, absl::string_view source,
               absl::string_view prefix = "")
      : object_(object), source_(source), prefix_(prefix) {}

  absl::Status Error(absl::string_view key, absl::string_view message) const {
    return KeyError(source_, absl::StrCat(prefix_, key), message);
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

  absl::StatusOr<std::optional<int64_t>> MaybeInt(absl::string_view key,
                                                  int64_t min,
                                                  int64_t max) const {
    const Json* value = Find(key);
    if (value == nullptr) return std::nullopt;
    return IntValue(key, *value, min, max);
  }

  absl::StatusOr<std::optional<double>> MaybeNumber(
      absl::string_view key) const {
    const Json* value = Find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number()) {
      return Error(key,
                   absl::StrCat("must be a number; got ", Describe(*value)));
    }
    return value->get<double>();
  }

  absl::StatusOr<double> OptionalNumber(absl::string_view key,
                                        double fallback) const {
    ASSIGN_OR_RETURN(const std::optional<double> value, MaybeNumber(key));
    return value.value_or(fallback);
  }

  // A number the key must have (HF raises KeyError without it).
  absl::StatusOr<double> Number(absl::string_view key) const {
    ASSIGN_OR_RETURN(const std::optional<double> value, MaybeNumber(key));
    if (!value.has_value()) return Error(key, "missing");
    return *value;
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
  std::string prefix_;
};

// rope_scaling, or transformers 5's rope_parameters (which also carries
// rope_theta), and partial_rotary_factor, into c.rope_scaling (and
// c.rope_theta): read after max_position_embeddings and rope_theta.
// InvalidArgument naming the key for an unknown rope_type, a missing key
// HF requires, or a value of the wrong type.
absl::Status ParseRope(const ConfigReader& reader, absl::string_view source,
                       HfLlamaConfig& c);

// rope_scaling as HF writes it: null for the default type, else rope_type
// and the keys the type reads.
OrderedJson RopeScalingJson(const HfLlamaConfig& c);

// bos_token_id, eos_token_id (an integer or a list) and pad_token_id.
absl::Status ParseTokenIds(const ConfigReader& reader,
                           engine::SpecialTokenIds& ids);

}  // namespace conveyor::hf::config_internal

#endif  // CONVEYOR_HF_INTERNAL_CONFIG_JSON_H_
