// The nested keys of config.json (hf/internal/config_json.h): rope_scaling
// with HF's semantics for each rope_type, and the special token ids.
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/rope.h"
#include "hf/internal/config_json.h"

namespace conveyor::hf::config_internal {
namespace {

// Token ids are kept, not used: any 32-bit integer, and lists of a sane
// length.
constexpr int64_t kMinTokenId = -(int64_t{1} << 31);
constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 1;
constexpr size_t kMaxEosIds = 1024;

}  // namespace

absl::Status ParseTokenIds(const ConfigReader& r, engine::SpecialTokenIds& t) {
  ASSIGN_OR_RETURN(t.bos, r.MaybeInt("bos_token_id", kMinTokenId, kMaxTokenId));
  ASSIGN_OR_RETURN(t.pad, r.MaybeInt("pad_token_id", kMinTokenId, kMaxTokenId));
  const Json* eos = r.Find("eos_token_id");
  if (eos == nullptr) return absl::OkStatus();
  auto bad = [&] {
    return r.Error("eos_token_id",
                   absl::StrCat("must be an integer in [", kMinTokenId, ", ",
                                kMaxTokenId, "] or a list of at most ",
                                kMaxEosIds, " of them; got ", Describe(*eos)));
  };
  t.eos_is_list = eos->is_array();
  const Json one = Json::array({*eos});
  const Json& ids = t.eos_is_list ? *eos : one;
  if (ids.size() > kMaxEosIds) return bad();
  for (const Json& id : ids) {
    if (!id.is_number_integer() ||
        (id.is_number_unsigned() &&
         id.get<uint64_t>() > static_cast<uint64_t>(kMaxTokenId)) ||
        id.get<int64_t>() < kMinTokenId || id.get<int64_t>() > kMaxTokenId) {
      return bad();
    }
    t.eos.push_back(id.get<int64_t>());
  }
  return absl::OkStatus();
}

// rope_scaling, or transformers 5's rope_parameters, which also carries
// rope_theta. After max_position_embeddings and rope_theta are read.
absl::Status ParseRope(const ConfigReader& r, absl::string_view source,
                       HfLlamaConfig& c) {
  absl::string_view key = "rope_scaling";
  const Json* value = r.Find(key);
  if (value == nullptr && r.Find("rope_parameters") != nullptr) {
    key = "rope_parameters";
    value = r.Find(key);
  }
  ASSIGN_OR_RETURN(const double partial,
                   r.OptionalNumber("partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    return r.Error("partial_rotary_factor",
                   absl::StrCat("must be 1 (every feature of a head turns); "
                                "got ",
                                partial));
  }
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_object()) {
    return r.Error(
        key, absl::StrCat("must be an object or null; got ", Describe(*value)));
  }
  const ConfigReader s(*value, source, absl::StrCat(key, "."));
  // "type" is the older name of rope_type, which HF still reads.
  const absl::string_view type_key =
      s.Find("rope_type") != nullptr || s.Find("type") == nullptr ? "rope_type"
                                                                  : "type";
  ASSIGN_OR_RETURN(const std::string name,
                   s.OptionalString(type_key, "default"));
  const std::optional<engine::RopeType> type = engine::RopeTypeFromName(name);
  if (!type.has_value()) {
    return s.Error(
        type_key,
        absl::StrCat("must be one of ",
                     absl::StrJoin(engine::kRopeTypeNames, ", "),
                     " (the types Conveyor computes); got \"", name, "\""));
  }
  if (key == "rope_parameters" && r.Find("rope_theta") == nullptr) {
    ASSIGN_OR_RETURN(c.rope_theta, s.OptionalNumber("rope_theta", 10000.0));
  }
  ASSIGN_OR_RETURN(const double inner_partial,
                   s.OptionalNumber("partial_rotary_factor", 1.0));
  if (inner_partial != 1.0) {
    return s.Error("partial_rotary_factor",
                   absl::StrCat("must be 1 (every feature of a head turns); "
                                "got ",
                                inner_partial));
  }
  engine::RopeScaling& out = c.rope_scaling;
  out = {.type = *type};
  if (out.type == engine::RopeType::kDefault) return absl::OkStatus();
  ASSIGN_OR_RETURN(out.factor, s.Number("factor"));
  constexpr int64_t kMax = kMaxHfDimension;
  if (out.type == engine::RopeType::kDynamic) {
    // HF grows theta past the config's max_position_embeddings.
    out.original_max_position_embeddings = c.max_position_embeddings;
  } else if (out.type == engine::RopeType::kYarn) {
    ASSIGN_OR_RETURN(out.original_max_position_embeddings,
                     s.OptionalInt("original_max_position_embeddings", 1, kMax,
                                   c.max_position_embeddings));
    // HF: `get("beta_fast") or 32`, so 0 means the default too.
    ASSIGN_OR_RETURN(out.beta_fast, s.OptionalNumber("beta_fast", 32.0));
    if (out.beta_fast == 0.0) out.beta_fast = 32.0;
    ASSIGN_OR_RETURN(out.beta_slow, s.OptionalNumber("beta_slow", 1.0));
    if (out.beta_slow == 0.0) out.beta_slow = 1.0;
    ASSIGN_OR_RETURN(out.attention_factor, s.MaybeNumber("attention_factor"));
    ASSIGN_OR_RETURN(out.mscale, s.MaybeNumber("mscale"));
    ASSIGN_OR_RETURN(out.mscale_all_dim, s.MaybeNumber("mscale_all_dim"));
    ASSIGN_OR_RETURN(out.truncate, s.OptionalBool("truncate", true));
  } else if (out.type == engine::RopeType::kLlama3) {
    ASSIGN_OR_RETURN(out.low_freq_factor, s.Number("low_freq_factor"));
    ASSIGN_OR_RETURN(out.high_freq_factor, s.Number("high_freq_factor"));
    ASSIGN_OR_RETURN(out.original_max_position_embeddings,
                     s.Int("original_max_position_embeddings", 1, kMax));
  }
  return absl::OkStatus();
}

// rope_scaling as HF writes it: null for the default, else rope_type and
// the keys the type reads.
OrderedJson RopeScalingJson(const HfLlamaConfig& c) {
  const engine::RopeScaling& r = c.rope_scaling;
  if (r.type == engine::RopeType::kDefault) return nullptr;
  OrderedJson j;
  j["rope_type"] = std::string(engine::RopeTypeName(r.type));
  j["factor"] = r.factor;
  switch (r.type) {
    case engine::RopeType::kYarn:
      // Written only when it is not max_position_embeddings: transformers
      // 4.50 to 4.55 took its presence to mean factor = max / original.
      if (r.original_max_position_embeddings != c.max_position_embeddings) {
        j["original_max_position_embeddings"] =
            r.original_max_position_embeddings;
      }
      j["beta_fast"] = r.beta_fast;
      j["beta_slow"] = r.beta_slow;
      if (r.attention_factor) j["attention_factor"] = *r.attention_factor;
      if (r.mscale) j["mscale"] = *r.mscale;
      if (r.mscale_all_dim) j["mscale_all_dim"] = *r.mscale_all_dim;
      if (!r.truncate) j["truncate"] = false;
      break;
    case engine::RopeType::kLlama3:
      j["low_freq_factor"] = r.low_freq_factor;
      j["high_freq_factor"] = r.high_freq_factor;
      j["original_max_position_embeddings"] =
          r.original_max_position_embeddings;
      break;
    default:
      break;
  }
  return j;
}

}  // namespace conveyor::hf::config_internal
