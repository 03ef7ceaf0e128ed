#include "engine/layer_kinds.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "engine/layers/activation.h"
#include "engine/layers/attention.h"
#include "engine/layers/delay.h"
#include "engine/layers/dense.h"
#include "engine/layers/embedding.h"
#include "engine/layers/layer_norm.h"
#include "engine/layers/llama_block.h"
#include "engine/layers/rms_norm.h"
#include "engine/layers/transformer_block.h"

namespace conveyor::engine {
namespace {

using Built = absl::StatusOr<std::unique_ptr<Layer>>;

// --- Shared by the rows
// -------------------------------------------------------

std::string Prefix(const LayerSpec& layer) {
  return absl::StrCat("layers.", layer.index, ".");
}

// The input's last dimension (every shape has rank >= 1).
int64_t Features(const LayerSpec& layer) { return layer.input_shape.back(); }

ParamSpec MakeParam(absl::string_view prefix, absl::string_view name,
                    std::vector<int64_t> shape, ParamInit init,
                    double bound_or_std) {
  return ParamSpec{absl::StrCat(prefix, name), std::move(shape), init,
                   bound_or_std};
}

// PyTorch's default Linear init: kaiming_uniform(a=sqrt(5)) for the weight and
// U(±1/sqrt(fan_in)) for the bias reduce to the same bound.
double LinearBound(int64_t fan_in) {
  return 1.0 / std::sqrt(static_cast<double>(fan_in));
}

void AddLinearParams(absl::string_view prefix, int64_t in, int64_t out,
                     bool bias, std::vector<ParamSpec>& params) {
  params.push_back(MakeParam(prefix, "weight", {out, in}, ParamInit::kUniform,
                             LinearBound(in)));
  if (bias) {
    params.push_back(
        MakeParam(prefix, "bias", {out}, ParamInit::kUniform, LinearBound(in)));
  }
}

void AddLayerNormParams(absl::string_view prefix, int64_t d,
                        std::vector<ParamSpec>& params) {
  params.push_back(MakeParam(prefix, "weight", {d}, ParamInit::kOnes, 0.0));
  params.push_back(MakeParam(prefix, "bias", {d}, ParamInit::kZeros, 0.0));
}

// torch.nn.MultiheadAttention's parameters: in_proj_weight [3q, d] with
// xavier_uniform over the whole packed matrix, zero biases, out_proj as a
// Linear(q, d) with a zeroed bias.
void AddAttentionParams(absl::string_view prefix, int64_t d, int64_t q,
                        bool bias, std::vector<ParamSpec>& params) {
  params.push_back(MakeParam(prefix, "in_proj_weight", {3 * q, d},
                             ParamInit::kXavierUniform,
                             std::sqrt(6.0 / static_cast<double>(d + 3 * q))));
  if (bias) {
    params.push_back(
        MakeParam(prefix, "in_proj_bias", {3 * q}, ParamInit::kZeros, 0.0));
  }
  params.push_back(MakeParam(prefix, "out_proj.weight", {d, q},
                             ParamInit::kUniform, LinearBound(q)));
  if (bias) {
    params.push_back(
        MakeParam(prefix, "out_proj.bias", {d}, ParamInit::kZeros, 0.0));
  }
}

absl::Status NeedsSequence(const LayerSpec& layer) {
  const std::vector<int64_t>& in = layer.input_shape;
  if (in.size() == 2) return absl::OkStatus();
  return LayerError(
      layer,
      absl::StrCat("needs a 2-D input [seq, features]; got ", ShapeString(in),
                   in.size() == 1 ? " (start with an embedding, or give "
                                    "input_shape as [seq, features])"
                                  : ""));
}

absl::Status NoOptions(const LayerOptions&, LayerSpec&) {
  return absl::OkStatus();
}
absl::Status SameShape(LayerSpec&) { return absl::OkStatus(); }

// --- dense: torch.nn.Linear
// -----------------------------------------------------

constexpr absl::string_view kDenseKeys[] = {"features", "bias"};

absl::Status ParseDense(const LayerOptions& o, LayerSpec& l) {
  RETURN_IF_ERROR(o.Dim("features", true, 1, l.features));
  return o.Flag("bias", l.bias);
}

absl::Status InferDense(LayerSpec& l) {
  AddLinearParams(Prefix(l), Features(l), l.features, l.bias, l.params);
  l.output_shape.back() = l.features;
  return absl::OkStatus();
}

Built BuildDense(Backend* b, const LayerSpec& l) {
  return Dense::Create(b, Prefix(l), Features(l), l.features, l.bias);
}

// --- relu, gelu
// ---------------------------------------------------------------

constexpr absl::string_view kGeluKeys[] = {"approximate"};

absl::Status ParseGelu(const LayerOptions& o, LayerSpec& l) {
  int approximate = l.approximate_tanh ? 1 : 0;
  RETURN_IF_ERROR(o.Enum("approximate", {"none", "tanh"}, approximate));
  l.approximate_tanh = approximate == 1;
  return absl::OkStatus();
}

Built BuildRelu(Backend* b, const LayerSpec&) {
  return std::make_unique<Activation>(b, Activation::Kind::kRelu);
}

Built BuildGelu(Backend* b, const LayerSpec& l) {
  return std::make_unique<Activation>(b, l.approximate_tanh
                                             ? Activation::Kind::kGeluTanh
                                             : Activation::Kind::kGelu);
}

// --- layernorm: torch.nn.LayerNorm ------------------------------------------

constexpr absl::string_view kEpsKeys[] = {"eps"};

absl::Status ParseLayerNorm(const LayerOptions& o, LayerSpec& l) {
  return o.Positive("eps", HUGE_VAL, l.eps);
}

absl::Status InferLayerNorm(LayerSpec& l) {
  AddLayerNormParams(Prefix(l), Features(l), l.params);
  return absl::OkStatus();
}

Built BuildLayerNorm(Backend* b, const LayerSpec& l) {
  return LayerNormLayer::Create(b, Prefix(l), Features(l),
                                static_cast<float>(l.eps));
}

// --- embedding: torch.nn.Embedding, optionally with learned positions -------

constexpr absl::string_view kEmbeddingKeys[] = {"vocab_size", "features",
                                                "max_positions"};

absl::Status ParseEmbedding(const LayerOptions& o, LayerSpec& l) {
  RETURN_IF_ERROR(o.Dim("vocab_size", true, 1, l.vocab_size));
  RETURN_IF_ERROR(o.Dim("features", true, 1, l.features));
  return o.Dim("max_positions", false, 0, l.max_positions);
}

absl::Status InferEmbedding(LayerSpec& l) {
  const std::vector<int64_t>& in = l.input_shape;
  if (l.index != 0) {
    return LayerError(l,
                      "must be the first layer: it takes integer token ids, "
                      "and only the model's input is token ids");
  }
  if (in.size() != 1) {
    return LayerError(l, absl::StrCat("needs a 1-D input [seq] of token ids; "
                                      "got input_shape ",
                                      ShapeString(in)));
  }
  const int64_t seq = in[0];
  if (l.max_positions > 0 && seq > l.max_positions) {
    return LayerError(l, absl::StrCat("the input has ", seq,
                                      " positions, more than max_positions = ",
                                      l.max_positions));
  }
  const std::string prefix = Prefix(l);
  l.params.push_back(MakeParam(prefix, "weight", {l.vocab_size, l.features},
                               ParamInit::kNormal, 1.0));
  if (l.max_positions > 0) {
    l.params.push_back(MakeParam(prefix, "position.weight",
                                 {l.max_positions, l.features},
                                 ParamInit::kNormal, 1.0));
  }
  l.output_shape = {seq, l.features};
  return absl::OkStatus();
}

Built BuildEmbedding(Backend* b, const LayerSpec& l) {
  return Embedding::Create(b, Prefix(l), l.vocab_size, l.features,
                           l.max_positions);
}

// --- attention: torch.nn.MultiheadAttention as self-attention ---------------

constexpr absl::string_view kAttentionKeys[] = {"heads", "causal",
                                                "qkv_features", "bias"};

absl::Status ParseAttention(const LayerOptions& o, LayerSpec& l) {
  RETURN_IF_ERROR(o.Dim("heads", true, 1, l.heads));
  RETURN_IF_ERROR(o.Flag("causal", l.causal));
  RETURN_IF_ERROR(o.Dim("qkv_features", false, 0, l.qkv_features));
  return o.Flag("bias", l.bias);
}

absl::Status InferAttention(LayerSpec& l) {
  RETURN_IF_ERROR(NeedsSequence(l));
  if (l.qkv_features == 0) l.qkv_features = Features(l);
  if (l.qkv_features % l.heads != 0) {
    return LayerError(l,
                      absl::StrCat("qkv_features = ", l.qkv_features,
                                   " is not divisible by heads = ", l.heads));
  }
  AddAttentionParams(Prefix(l), Features(l), l.qkv_features, l.bias, l.params);
  return absl::OkStatus();
}

Built BuildAttention(Backend* b, const LayerSpec& l) {
  return SelfAttention::Create(b, Prefix(l), Features(l), l.heads,
                               l.qkv_features, l.causal, l.bias);
}

// --- transformer_block: the JaxPP notebook's block, post- or pre-norm -------

constexpr absl::string_view kBlockKeys[] = {
    "heads", "mlp_features", "causal", "norm", "eps", "approximate"};

absl::Status ParseTransformerBlock(const LayerOptions& o, LayerSpec& l) {
  RETURN_IF_ERROR(o.Dim("heads", true, 1, l.heads));
  RETURN_IF_ERROR(o.Dim("mlp_features", true, 1, l.mlp_features));
  RETURN_IF_ERROR(o.Flag("causal", l.causal));
  int norm = l.pre_norm ? 1 : 0;
  RETURN_IF_ERROR(o.Enum("norm", {"post", "pre"}, norm));
  l.pre_norm = norm == 1;
  RETURN_IF_ERROR(o.Positive("eps", HUGE_VAL, l.eps));
  return ParseGelu(o, l);
}

absl::Status InferTransformerBlock(LayerSpec& l) {
  RETURN_IF_ERROR(NeedsSequence(l));
  const int64_t d = Features(l);
  if (d % l.heads != 0) {
    return LayerError(l,
                      absl::StrCat("the input's features (", d,
                                   ") are not divisible by heads = ", l.heads));
  }
  l.qkv_features = d;
  const std::string prefix = Prefix(l);
  AddAttentionParams(prefix + "attn.", d, d, /*bias=*/true, l.params);
  AddLayerNormParams(prefix + "norm1.", d, l.params);
  AddLinearParams(prefix + "mlp.0.", d, l.mlp_features, /*bias=*/true,
                  l.params);
  AddLinearParams(prefix + "mlp.2.", l.mlp_features, d, /*bias=*/true,
                  l.params);
  AddLayerNormParams(prefix + "norm2.", d, l.params);
  return absl::OkStatus();
}

Built BuildTransformerBlock(Backend* b, const LayerSpec& l) {
  return MakeTransformerBlock(b, Prefix(l),
                              {.features = Features(l),
                               .heads = l.heads,
                               .mlp_features = l.mlp_features,
                               .causal = l.causal,
                               .pre_norm = l.pre_norm,
                               .eps = static_cast<float>(l.eps),
                               .gelu_tanh = l.approximate_tanh});
}

// --- lm_head: a Linear to the vocabulary, without bias by default -----------
// tied: true makes its weight the embedding's (HF's tie_word_embeddings),
// held by its stage as a tied copy (TieToEmbedding).

constexpr absl::string_view kLmHeadKeys[] = {"vocab_size", "bias", "tied"};

absl::Status ParseLmHead(const LayerOptions& o, LayerSpec& l) {
  l.bias = false;
  RETURN_IF_ERROR(o.Dim("vocab_size", true, 1, l.vocab_size));
  RETURN_IF_ERROR(o.Flag("bias", l.bias));
  return o.Flag("tied", l.tied);
}

absl::Status InferLmHead(LayerSpec& l) {
  if (l.tied && l.bias) {
    return LayerError(l,
                      "tied: true shares the embedding's weight, and an "
                      "embedding has no bias to share: drop bias: true");
  }
  // A tied head's parameter is the embedding's, which TieToEmbedding adds
  // once the model's first layer is known.
  if (!l.tied) {
    AddLinearParams(Prefix(l), Features(l), l.vocab_size, l.bias, l.params);
  }
  l.output_shape.back() = l.vocab_size;
  return absl::OkStatus();
}

Built BuildLmHead(Backend* b, const LayerSpec& l) {
  if (l.tied) {
    return Dense::CreateTiedCopy(b, l.params.at(0).name, Features(l),
                                 l.vocab_size);
  }
  return Dense::Create(b, Prefix(l), Features(l), l.vocab_size, l.bias);
}

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
    "heads", "kv_heads", "mlp_features", "eps", "rope_theta", "attention_bias"};

// HF's Llama init: every Linear weight N(0, initializer_range^2) with the
// default initializer_range of 0.02, norm weights ones.
constexpr double kLlamaInitStd = 0.02;
// The kernels take theta as a float.
constexpr double kMaxRopeTheta = 1e30;

absl::Status ParseLlamaBlock(const LayerOptions& o, LayerSpec& l) {
  l.bias = false;
  l.eps = 1e-6;
  RETURN_IF_ERROR(o.Dim("heads", true, 1, l.heads));
  RETURN_IF_ERROR(o.Dim("kv_heads", false, 1, l.kv_heads));
  if (l.kv_heads == 0) l.kv_heads = l.heads;
  RETURN_IF_ERROR(o.Dim("mlp_features", true, 1, l.mlp_features));
  RETURN_IF_ERROR(o.Positive("eps", HUGE_VAL, l.eps));
  RETURN_IF_ERROR(o.Positive("rope_theta", kMaxRopeTheta, l.rope_theta));
  return o.Flag("attention_bias", l.bias);
}

absl::Status InferLlamaBlock(LayerSpec& l) {
  RETURN_IF_ERROR(NeedsSequence(l));
  const int64_t d = Features(l);
  if (d % l.heads != 0 || (d / l.heads) % 2 != 0) {
    return LayerError(l, absl::StrCat("the input's features (", d,
                                      ") must split into heads = ", l.heads,
                                      " of an even head size (rotary "
                                      "embedding turns pairs)"));
  }
  if (l.heads % l.kv_heads != 0) {
    return LayerError(l, absl::StrCat("kv_heads = ", l.kv_heads,
                                      " does not divide heads = ", l.heads,
                                      " (each key/value head serves a whole "
                                      "group of query heads)"));
  }
  l.qkv_features = d;
  l.causal = true;
  const std::string prefix = Prefix(l);
  const int64_t kv = l.kv_heads * (d / l.heads);
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
  linear("self_attn.q_proj.weight", d, d);
  bias("self_attn.q_proj.bias", d);
  linear("self_attn.k_proj.weight", kv, d);
  bias("self_attn.k_proj.bias", kv);
  linear("self_attn.v_proj.weight", kv, d);
  bias("self_attn.v_proj.bias", kv);
  linear("self_attn.o_proj.weight", d, d);
  params.push_back(MakeParam(prefix, "post_attention_layernorm.weight", {d},
                             ParamInit::kOnes, 0.0));
  linear("mlp.gate_proj.weight", l.mlp_features, d);
  linear("mlp.up_proj.weight", l.mlp_features, d);
  linear("mlp.down_proj.weight", d, l.mlp_features);
  return absl::OkStatus();
}

Built BuildLlamaBlock(Backend* b, const LayerSpec& l) {
  return MakeLlamaBlock(b, Prefix(l),
                        {.features = Features(l),
                         .heads = l.heads,
                         .kv_heads = l.kv_heads,
                         .mlp_features = l.mlp_features,
                         .eps = static_cast<float>(l.eps),
                         .rope_theta = static_cast<float>(l.rope_theta),
                         .attention_bias = l.bias});
}

// --- delay: an identity of known cost, for tests and benchmarks -------------

constexpr absl::string_view kDelayKeys[] = {
    "forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms"};

absl::Status ParseDelay(const LayerOptions& o, LayerSpec& l) {
  const YamlReader& reader = o.reader();
  const YamlMap& map = o.map();
  auto millis = [&](const YamlMapEntry& e) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(const double ms, reader.ParseNonNegativeDouble(e.value));
    if (ms > kMaxDelayMs) {
      return reader.Error(e.value, absl::StrCat("must be at most ", kMaxDelayMs,
                                                " (one minute); got ",
                                                DescribeYaml(e.value.node)));
    }
    return ms;
  };
  ASSIGN_OR_RETURN(const YamlMapEntry* forward,
                   reader.Require(map, "forward_ms"));
  ASSIGN_OR_RETURN(l.forward_ms, millis(*forward));
  const YamlMapEntry* backward = map.Find("backward_ms");
  const YamlMapEntry* input = map.Find("backward_input_ms");
  const YamlMapEntry* weight = map.Find("backward_weight_ms");
  // The backward is given whole or split, never both: with both, which one
  // B costs would be a guess.
  if (backward != nullptr && (input != nullptr || weight != nullptr)) {
    const YamlMapEntry& split = input != nullptr ? *input : *weight;
    return YamlError(split.key_where, split.value.path,
                     "give either backward_ms or the split backward "
                     "(backward_input_ms and backward_weight_ms), not both");
  }
  if (backward != nullptr) {
    ASSIGN_OR_RETURN(l.backward_input_ms, millis(*backward));
    l.backward_weight_ms = 0.0;
    return absl::OkStatus();
  }
  if (input == nullptr && weight == nullptr) {
    return reader.Error(map.self,
                        "missing required key 'backward_ms' (or "
                        "backward_input_ms and backward_weight_ms for a split "
                        "backward)");
  }
  if (input == nullptr || weight == nullptr) {
    return reader.Error(
        map.self,
        absl::StrCat(
            "a split backward needs both backward_input_ms and "
            "backward_weight_ms; missing '",
            input == nullptr ? "backward_input_ms" : "backward_weight_ms",
            "'"));
  }
  ASSIGN_OR_RETURN(l.backward_input_ms, millis(*input));
  ASSIGN_OR_RETURN(l.backward_weight_ms, millis(*weight));
  return absl::OkStatus();
}

Built BuildDelay(Backend*, const LayerSpec& l) {
  return std::make_unique<Delay>(l.forward_ms, l.backward_input_ms,
                                 l.backward_weight_ms);
}

// --- The table
// ------------------------------------------------------------------

const LayerKindRow kRows[] = {
    {LayerKind::kDense, "dense", kDenseKeys, ParseDense, InferDense, BuildDense,
     "- dense: {features: 8, bias: true}", "[4, 6]"},
    {LayerKind::kRelu,
     "relu",
     {},
     NoOptions,
     SameShape,
     BuildRelu,
     "- relu",
     "[4, 6]"},
    {LayerKind::kGelu, "gelu", kGeluKeys, ParseGelu, SameShape, BuildGelu,
     "- gelu: {approximate: tanh}", "[4, 6]"},
    {LayerKind::kLayerNorm, "layernorm", kEpsKeys, ParseLayerNorm,
     InferLayerNorm, BuildLayerNorm, "- layernorm: {eps: 1e-5}", "[4, 6]"},
    {LayerKind::kEmbedding, "embedding", kEmbeddingKeys, ParseEmbedding,
     InferEmbedding, BuildEmbedding,
     "- embedding: {vocab_size: 50, features: 8, max_positions: 16}", "[12]"},
    {LayerKind::kAttention, "attention", kAttentionKeys, ParseAttention,
     InferAttention, BuildAttention,
     "- attention: {heads: 2, qkv_features: 12, causal: true}", "[5, 8]"},
    {LayerKind::kTransformerBlock, "transformer_block", kBlockKeys,
     ParseTransformerBlock, InferTransformerBlock, BuildTransformerBlock,
     "- transformer_block: {heads: 2, mlp_features: 16, norm: pre}", "[5, 8]"},
    {LayerKind::kLmHead, "lm_head", kLmHeadKeys, ParseLmHead, InferLmHead,
     BuildLmHead, "- lm_head: {vocab_size: 50}", "[5, 8]"},
    {LayerKind::kRmsNorm, "rmsnorm", kEpsKeys, ParseRmsNorm, InferRmsNorm,
     BuildRmsNorm, "- rmsnorm: {eps: 1e-5}", "[5, 8]"},
    {LayerKind::kLlamaBlock, "llama_block", kLlamaBlockKeys, ParseLlamaBlock,
     InferLlamaBlock, BuildLlamaBlock,
     "- llama_block: {heads: 4, kv_heads: 2, mlp_features: 24, "
     "attention_bias: true}",
     "[5, 16]"},
    {LayerKind::kDelay, "delay", kDelayKeys, ParseDelay, SameShape, BuildDelay,
     "- delay: {forward_ms: 0, backward_ms: 0}", "[4, 6]"},
};

}  // namespace

absl::Status LayerOptions::Dim(absl::string_view key, bool required,
                               int64_t min, int64_t& field) const {
  const YamlMapEntry* e = map_.Find(key);
  if (e == nullptr) {
    if (required) return reader_.Require(map_, key).status();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(field, reader_.ParseInt(e->value, min, kMaxModelDimension));
  return absl::OkStatus();
}

absl::Status LayerOptions::Flag(absl::string_view key, bool& field) const {
  if (const YamlMapEntry* e = map_.Find(key); e != nullptr) {
    ASSIGN_OR_RETURN(field, reader_.ParseBool(e->value));
  }
  return absl::OkStatus();
}

absl::Status LayerOptions::Positive(absl::string_view key, double max,
                                    double& field) const {
  const YamlMapEntry* e = map_.Find(key);
  if (e == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const double value, reader_.ParsePositiveDouble(e->value));
  if (value > max) {
    return reader_.Error(e->value,
                         absl::StrCat("must be at most ", max, "; got ",
                                      DescribeYaml(e->value.node)));
  }
  field = value;
  return absl::OkStatus();
}

absl::Status LayerOptions::Enum(absl::string_view key,
                                std::initializer_list<absl::string_view> names,
                                int& index) const {
  if (const YamlMapEntry* e = map_.Find(key); e != nullptr) {
    ASSIGN_OR_RETURN(index, reader_.ParseEnum(e->value, names));
  }
  return absl::OkStatus();
}

absl::Status LayerError(const LayerSpec& layer, absl::string_view message) {
  return YamlError(layer.where, layer.path,
                   absl::StrCat(LayerKindName(layer.kind), " (layer ",
                                layer.index, "): ", message));
}

std::span<const LayerKindRow> LayerKindTable() { return kRows; }

const LayerKindRow* FindLayerKind(absl::string_view name) {
  for (const LayerKindRow& row : kRows) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

const LayerKindRow& LayerKindRowOf(LayerKind kind) {
  for (const LayerKindRow& row : kRows) {
    if (row.kind == kind) return row;
  }
  CONVEYOR_CHECK(false, "a layer kind without a row in the table");
  return kRows[0];
}

absl::string_view LayerKindName(LayerKind kind) {
  return LayerKindRowOf(kind).name;
}

absl::Status TieToEmbedding(const LayerSpec* first, LayerSpec& head) {
  if (first == nullptr) {
    return LayerError(
        head,
        "tied: true shares the weight of an embedding, and the model "
        "must begin with one; it begins with this lm_head");
  }
  if (first->kind != LayerKind::kEmbedding) {
    return LayerError(
        head, absl::StrCat("tied: true shares the weight of the embedding the "
                           "model begins with, but its first layer is a ",
                           LayerKindName(first->kind)));
  }
  if (first->vocab_size != head.vocab_size) {
    return LayerError(head, absl::StrCat("tied: true needs the embedding's "
                                         "vocabulary, but vocab_size is ",
                                         head.vocab_size, " here and ",
                                         first->vocab_size, " there"));
  }
  if (first->features != Features(head)) {
    return LayerError(head,
                      absl::StrCat("tied: true needs an input as wide as the "
                                   "embedding's output (",
                                   first->features, " features); this one has ",
                                   Features(head)));
  }
  // The embedding's weight [vocab, features] is also the Linear weight
  // [out, in] the head multiplies by.
  ParamSpec copy = first->params.at(0);
  copy.tied_copy = true;
  head.params = {std::move(copy)};
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Layer>> BuildLayer(Backend* backend,
                                                  const LayerSpec& layer) {
  return LayerKindRowOf(layer.kind).build(backend, layer);
}

}  // namespace conveyor::engine
