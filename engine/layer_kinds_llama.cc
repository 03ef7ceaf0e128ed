// The layer-kind rows of the Llama family (HF's Llama, Mistral, Qwen2):
// rmsnorm (LlamaRMSNorm) and llama_block (LlamaDecoderLayer, with HF's
// head_dim and rope_scaling keys).
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/internal/layer_kind_rows.h"
#include "engine/layer_kinds.h"
#include "engine/layers/llama_block.h"
#include "engine/layers/rms_norm.h"
#include "engine/rope.h"
#include "engine/tensor.h"

namespace conveyor::engine::layer_kinds_internal {
namespace {

// --- rmsnorm: HF's LlamaRMSNorm ----------------------------------------------

absl::Status ParseRmsNorm(const LayerOptions& o, LayerSpec& l) {
  l.eps = 1e-6;  // LlamaRMSNorm's default
  return o.Positive("eps", HUGE_VAL, l.eps);
}

absl::Status InferRmsNorm(LayerSpec& l) {
  l.params.push_back(
      MakeParam(Prefix(l), "weight", {Features(l)}, ParamInit::kOnes, 0.0));
  return absl::OkStatus();
}

Built BuildRmsNorm(Backend* b, const LayerSpec& l) {
  return RmsNormLayer::Create(b, Prefix(l), Features(l),
                              static_cast<float>(l.eps));
}

// --- llama_block: HF's LlamaDecoderLayer (Llama, Mistral, Qwen2) ------------

constexpr absl::string_view kLlamaBlockKeys[] = {
    "heads", "kv_heads",   "head_dim",     "mlp_features",
    "eps",   "rope_theta", "rope_scaling", "attention_bias"};

// HF's Llama init: every Linear weight N(0, initializer_range^2) with the
// default initializer_range of 0.02, norm weights ones.
constexpr double kLlamaInitStd = 0.02;
// The kernels take theta as a float.
constexpr double kMaxRopeTheta = 1e30;

// rope_scaling's keys, HF's names, by rope_type (indexed by RopeType).
constexpr absl::string_view kDefaultRopeKeys[] = {"rope_type"};
constexpr absl::string_view kLinearRopeKeys[] = {"rope_type", "factor"};
constexpr absl::string_view kDynamicRopeKeys[] = {
    "rope_type", "factor", "original_max_position_embeddings"};
constexpr absl::string_view kYarnRopeKeys[] = {
    "rope_type", "factor",         "original_max_position_embeddings",
    "beta_fast", "beta_slow",      "attention_factor",
    "mscale",    "mscale_all_dim", "truncate"};
constexpr absl::string_view kLlama3RopeKeys[] = {
    "rope_type", "factor", "original_max_position_embeddings",
    "low_freq_factor", "high_freq_factor"};
constexpr YamlNames kRopeKeys[] = {kDefaultRopeKeys, kLinearRopeKeys,
                                   kDynamicRopeKeys, kYarnRopeKeys,
                                   kLlama3RopeKeys};
// The keys each type must have (a prefix of its keys above).
constexpr size_t kRequiredRopeKeys[] = {1, 2, 3, 3, 5};

// rope_scaling: {rope_type: llama3, factor: 32, ...}, HF's keys and
// semantics; after rope_theta, which some limits depend on.
absl::Status ParseRopeScaling(const LayerOptions& o, LayerSpec& l) {
  const YamlMapEntry* entry = o.map().Find("rope_scaling");
  if (entry == nullptr) return absl::OkStatus();
  const YamlReader& r = o.reader();
  ASSIGN_OR_RETURN(const YamlMap map, r.ReadAnyMap(entry->value));
  ASSIGN_OR_RETURN(const YamlMapEntry* type, r.Require(map, "rope_type"));
  ASSIGN_OR_RETURN(const int index, r.ParseEnum(type->value, kRopeTypeNames));
  RopeScaling s;
  s.type = static_cast<RopeType>(index);
  const YamlNames keys = kRopeKeys[index];
  if (const YamlMapEntry* bad = YamlReader::FirstUnknownKey(map, keys)) {
    return YamlError(
        bad->key_where, bad->value.path,
        absl::StrCat("not a key of rope_type ", type->value.node.Scalar(),
                     "; its keys: ", absl::StrJoin(keys, ", ")));
  }
  for (size_t i = 0; i < kRequiredRopeKeys[index]; ++i) {
    RETURN_IF_ERROR(r.Require(map, keys[i]).status());
  }
  for (const YamlMapEntry& e : map.entries) {
    const absl::string_view key = e.key;
    if (key == "rope_type") continue;
    if (key == "original_max_position_embeddings") {
      ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                       r.ParseInt(e.value, 1, kMaxModelDimension));
    } else if (key == "truncate") {
      ASSIGN_OR_RETURN(s.truncate, r.ParseBool(e.value));
    } else {
      ASSIGN_OR_RETURN(const double v, r.ParseNumber(e.value));
      if (key == "factor") s.factor = v;
      if (key == "low_freq_factor") s.low_freq_factor = v;
      if (key == "high_freq_factor") s.high_freq_factor = v;
      if (key == "beta_fast") s.beta_fast = v;
      if (key == "beta_slow") s.beta_slow = v;
      if (key == "attention_factor") s.attention_factor = v;
      if (key == "mscale") s.mscale = v;
      if (key == "mscale_all_dim") s.mscale_all_dim = v;
    }
  }
  if (const auto problem = CheckRopeScaling(s, l.rope_theta, l.head_dim)) {
    // At the key, or at the option outside the map it depends on.
    const YamlMapEntry* at = map.Find(problem->key);
    if (at == nullptr) at = o.map().Find(problem->key);
    return r.Error(at != nullptr ? at->value : entry->value, problem->message);
  }
  l.rope_scaling = s;
  return absl::OkStatus();
}

absl::Status ParseLlamaBlock(const LayerOptions& o, LayerSpec& l) {
  l.bias = false;
  l.eps = 1e-6;
  RETURN_IF_ERROR(o.Dim("heads", true, 1, l.heads));
  RETURN_IF_ERROR(o.Dim("kv_heads", false, 1, l.kv_heads));
  if (l.kv_heads == 0) l.kv_heads = l.heads;
  RETURN_IF_ERROR(o.Dim("head_dim", false, 1, l.head_dim));
  if (l.head_dim % 2 != 0) {
    return o.reader().Error(o.map().Find("head_dim")->value,
                            absl::StrCat("must be even (rotary embedding "
                                         "turns pairs of features); got ",
                                         l.head_dim));
  }
  RETURN_IF_ERROR(o.Dim("mlp_features", true, 1, l.mlp_features));
  RETURN_IF_ERROR(o.Positive("eps", HUGE_VAL, l.eps));
  RETURN_IF_ERROR(o.Positive("rope_theta", kMaxRopeTheta, l.rope_theta));
  RETURN_IF_ERROR(ParseRopeScaling(o, l));
  return o.Flag("attention_bias", l.bias);
}

absl::Status InferLlamaBlock(LayerSpec& l) {
  RETURN_IF_ERROR(NeedsSequence(l));
  const int64_t d = Features(l);
  if (l.head_dim == 0) {
    if (d % l.heads != 0 || (d / l.heads) % 2 != 0) {
      return LayerError(
          l, absl::StrCat("the input's features (", d,
                          ") must split into heads = ", l.heads,
                          " of an even head size (rotary embedding turns "
                          "pairs)"));
    }
    l.head_dim = d / l.heads;
  }
  if (l.heads * l.head_dim > kMaxModelDimension) {
    return LayerError(l,
                      absl::StrCat("heads * head_dim = ", l.heads * l.head_dim,
                                   " is more than ", kMaxModelDimension));
  }
  if (l.heads % l.kv_heads != 0) {
    return LayerError(l, absl::StrCat("kv_heads = ", l.kv_heads,
                                      " does not divide heads = ", l.heads,
                                      " (each key/value head serves a whole "
                                      "group of query heads)"));
  }
  if (const auto problem =
          CheckRopeScaling(l.rope_scaling, l.rope_theta, l.head_dim)) {
    return LayerError(l, absl::StrCat(problem->key == "rope_theta" ||
                                              problem->key == "head_dim"
                                          ? ""
                                          : "rope_scaling.",
                                      problem->key, ": ", problem->message));
  }
  // The width of q and of the attention's output: what its FLOPs count.
  const int64_t q = l.heads * l.head_dim, kv = l.kv_heads * l.head_dim;
  l.qkv_features = q;
  l.causal = true;
  const std::string prefix = Prefix(l);
  std::vector<ParamSpec>& params = l.params;
  auto linear = [&](absl::string_view name, int64_t out, int64_t in) {
    params.push_back(
        MakeParam(prefix, name, {out, in}, ParamInit::kNormal, kLlamaInitStd));
  };
  auto bias = [&](absl::string_view name, int64_t out) {
    if (l.bias) {
      params.push_back(MakeParam(prefix, name, {out}, ParamInit::kZeros, 0.0));
    }
  };
  params.push_back(
      MakeParam(prefix, "input_layernorm.weight", {d}, ParamInit::kOnes, 0.0));
  linear("self_attn.q_proj.weight", q, d);
  bias("self_attn.q_proj.bias", q);
  linear("self_attn.k_proj.weight", kv, d);
  bias("self_attn.k_proj.bias", kv);
  linear("self_attn.v_proj.weight", kv, d);
  bias("self_attn.v_proj.bias", kv);
  linear("self_attn.o_proj.weight", d, q);
  params.push_back(MakeParam(prefix, "post_attention_layernorm.weight", {d},
                             ParamInit::kOnes, 0.0));
  linear("mlp.gate_proj.weight", l.mlp_features, d);
  linear("mlp.up_proj.weight", l.mlp_features, d);
  linear("mlp.down_proj.weight", d, l.mlp_features);
  return absl::OkStatus();
}

LlamaBlockOptions LlamaOptions(const LayerSpec& l) {
  return {.features = Features(l),
          .heads = l.heads,
          .kv_heads = l.kv_heads,
          .head_dim = l.head_dim,
          .mlp_features = l.mlp_features,
          .eps = static_cast<float>(l.eps),
          .rope_theta = l.rope_theta,
          .rope_scaling = l.rope_scaling,
          .attention_bias = l.bias};
}

Built BuildLlamaBlock(Backend* b, const LayerSpec& l) {
  return MakeLlamaBlock(b, Prefix(l), LlamaOptions(l));
}

Built BuildLlamaBlockShard(Backend* b, const LayerSpec& l,
                           const TensorParallelRank& rank) {
  LlamaBlockOptions options = LlamaOptions(l);
  options.tensor_parallel = rank;
  return MakeLlamaBlock(b, Prefix(l), options);
}

// Each rank takes whole query heads, whole key/value heads (so GQA groups
// stay on one rank) and whole hidden units.
absl::Status CheckLlamaBlockShard(const LayerSpec& l, int64_t ranks) {
  return CountsSplit(l, ranks,
                     {{"heads", l.heads},
                      {"kv_heads", l.kv_heads},
                      {"mlp_features", l.mlp_features}});
}

}  // namespace

LayerKindRow RmsNormRow() {
  return {.kind = LayerKind::kRmsNorm,
          .name = "rmsnorm",
          .keys = kEpsKeys,
          .parse = ParseRmsNorm,
          .infer = InferRmsNorm,
          .build = BuildRmsNorm,
          .example = "- rmsnorm: {eps: 1e-5}",
          .example_input = "[5, 8]"};
}

LayerKindRow LlamaBlockRow() {
  return {.kind = LayerKind::kLlamaBlock,
          .name = "llama_block",
          .keys = kLlamaBlockKeys,
          .parse = ParseLlamaBlock,
          .infer = InferLlamaBlock,
          .build = BuildLlamaBlock,
          .example =
              "- llama_block: {heads: 4, kv_heads: 2, head_dim: 6, "
              "mlp_features: 24, attention_bias: true, rope_scaling: "
              "{rope_type: llama3, factor: 8, low_freq_factor: 1, "
              "high_freq_factor: 4, original_max_position_embeddings: 4}}",
          .example_input = "[5, 16]",
          .build_shard = BuildLlamaBlockShard,
          .check_shard = CheckLlamaBlockShard};
}

}  // namespace conveyor::engine::layer_kinds_internal
