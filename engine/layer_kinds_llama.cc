// The layer-kind rows of the Llama family (HF's Llama, Mistral, Qwen2):
// rmsnorm (LlamaRMSNorm) and llama_block (LlamaDecoderLayer).
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/internal/layer_kind_rows.h"
#include "engine/layer_kinds.h"
#include "engine/layers/llama_block.h"
#include "engine/layers/rms_norm.h"
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
              "- llama_block: {heads: 4, kv_heads: 2, mlp_features: 24, "
              "attention_bias: true}",
          .example_input = "[5, 16]"};
}

}  // namespace conveyor::engine::layer_kinds_internal
