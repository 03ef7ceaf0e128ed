#include "hf/names.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace conveyor::hf {
namespace {

constexpr absl::string_view kEmbedding = "model.embed_tokens.weight";
constexpr absl::string_view kFinalNorm = "model.norm.weight";
constexpr absl::string_view kLmHead = "lm_head.weight";
constexpr absl::string_view kHfBlockPrefix = "model.layers.";
constexpr absl::string_view kConveyorPrefix = "layers.";

// A decoder block's parameters, in the order Conveyor's llama_block
// declares them (engine/model_spec.cc).
constexpr absl::string_view kBlockSuffixes[] = {
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.weight",
    "self_attn.v_proj.bias",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};

bool IsBlockSuffix(absl::string_view suffix) {
  for (absl::string_view known : kBlockSuffixes) {
    if (suffix == known) return true;
  }
  return false;
}

// Names come from files: show them escaped and bounded.
std::string Shown(absl::string_view name) {
  constexpr size_t kMaxShown = 120;
  std::string shown = absl::CHexEscape(name.substr(0, kMaxShown));
  if (name.size() > kMaxShown) shown += "...";
  return absl::StrCat("\"", shown, "\"");
}

absl::Status NotInLayout(absl::string_view kind, absl::string_view name,
                         absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(kind, " tensor ", Shown(name), " ", why));
}

// Splits "<index>.<rest>" off `name`; the index is canonical decimal (no
// sign, no leading zeros, at most 9 digits), so each layer has one name.
std::optional<std::pair<int64_t, absl::string_view>> SplitIndex(
    absl::string_view name) {
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos || dot == 0 || dot > 9) {
    return std::nullopt;
  }
  const absl::string_view digits = name.substr(0, dot);
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  int64_t index = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + (c - '0');
  }
  return std::make_pair(index, name.substr(dot + 1));
}

}  // namespace

absl::StatusOr<std::string> HfNameToConveyor(absl::string_view hf_name,
                                             int64_t num_blocks) {
  if (hf_name == kEmbedding) return absl::StrCat(kConveyorPrefix, 0, ".weight");
  if (hf_name == kFinalNorm) {
    return absl::StrCat(kConveyorPrefix, num_blocks + 1, ".weight");
  }
  if (hf_name == kLmHead) {
    return absl::StrCat(kConveyorPrefix, num_blocks + 2, ".weight");
  }
  if (absl::StartsWith(hf_name, kHfBlockPrefix)) {
    const auto split = SplitIndex(hf_name.substr(kHfBlockPrefix.size()));
    if (split.has_value() && IsBlockSuffix(split->second)) {
      if (split->first >= num_blocks) {
        return NotInLayout(
            "HF", hf_name,
            absl::StrCat("names block ", split->first, ", but the model has ",
                         num_blocks, " (num_hidden_layers)"));
      }
      return absl::StrCat(kConveyorPrefix, split->first + 1, ".",
                          split->second);
    }
  }
  return NotInLayout("HF", hf_name,
                     "is not part of the Llama layout (model.embed_tokens, "
                     "model.layers.<i>.*, model.norm, lm_head)");
}

absl::StatusOr<std::string> ConveyorNameToHf(absl::string_view conveyor_name,
                                             int64_t num_blocks) {
  if (absl::StartsWith(conveyor_name, kConveyorPrefix)) {
    const auto split = SplitIndex(conveyor_name.substr(kConveyorPrefix.size()));
    if (split.has_value()) {
      const auto [layer, rest] = *split;
      if (layer == 0 && rest == "weight") return std::string(kEmbedding);
      if (layer >= 1 && layer <= num_blocks && IsBlockSuffix(rest)) {
        return absl::StrCat(kHfBlockPrefix, layer - 1, ".", rest);
      }
      if (layer == num_blocks + 1 && rest == "weight") {
        return std::string(kFinalNorm);
      }
      if (layer == num_blocks + 2 && rest == "weight") {
        return std::string(kLmHead);
      }
    }
  }
  return NotInLayout(
      "Conveyor", conveyor_name,
      absl::StrCat("is not part of the Llama layout with ", num_blocks,
                   " blocks (layers.0.weight, layers.1..", num_blocks,
                   ".<block parameter>, layers.", num_blocks + 1,
                   ".weight, layers.", num_blocks + 2, ".weight)"));
}

bool IsIgnorableHfTensor(absl::string_view hf_name) {
  return absl::EndsWith(hf_name, ".rotary_emb.inv_freq");
}

TensorShapes ExpectedLlamaTensors(const HfLlamaConfig& config) {
  const int64_t n = config.num_hidden_layers;
  const int64_t h = config.hidden_size;
  const int64_t q = config.num_attention_heads * config.head_dim();
  const int64_t kv = config.num_key_value_heads * config.head_dim();
  const int64_t inter = config.intermediate_size;
  TensorShapes tensors;
  tensors.reserve(static_cast<size_t>(n) * 12 + 3);
  tensors.emplace_back("layers.0.weight",
                       std::vector<int64_t>{config.vocab_size, h});
  for (int64_t layer = 1; layer <= n; ++layer) {
    const std::string prefix = absl::StrCat(kConveyorPrefix, layer, ".");
    auto add = [&](absl::string_view suffix, std::vector<int64_t> shape) {
      tensors.emplace_back(absl::StrCat(prefix, suffix), std::move(shape));
    };
    add("input_layernorm.weight", {h});
    add("self_attn.q_proj.weight", {q, h});
    if (config.attention_bias) add("self_attn.q_proj.bias", {q});
    add("self_attn.k_proj.weight", {kv, h});
    if (config.attention_bias) add("self_attn.k_proj.bias", {kv});
    add("self_attn.v_proj.weight", {kv, h});
    if (config.attention_bias) add("self_attn.v_proj.bias", {kv});
    add("self_attn.o_proj.weight", {h, q});
    add("post_attention_layernorm.weight", {h});
    add("mlp.gate_proj.weight", {inter, h});
    add("mlp.up_proj.weight", {inter, h});
    add("mlp.down_proj.weight", {h, inter});
  }
  tensors.emplace_back(absl::StrCat(kConveyorPrefix, n + 1, ".weight"),
                       std::vector<int64_t>{h});
  if (!config.tie_word_embeddings) {
    tensors.emplace_back(absl::StrCat(kConveyorPrefix, n + 2, ".weight"),
                         std::vector<int64_t>{config.vocab_size, h});
  }
  return tensors;
}

}  // namespace conveyor::hf
