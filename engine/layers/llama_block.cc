#include "engine/layers/llama_block.h"

#include <utility>

#include "common/status_macros.h"
#include "engine/layers/composite.h"
#include "engine/layers/llama_attention.h"
#include "engine/layers/rms_norm.h"
#include "engine/layers/swiglu.h"

namespace conveyor::engine {

absl::StatusOr<std::unique_ptr<Layer>> MakeLlamaBlock(
    Backend* backend, const std::string& prefix, const LlamaBlockOptions& o) {
  const int64_t d = o.features;
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> norm1,
      RmsNormLayer::Create(backend, prefix + "input_layernorm.", d, o.eps));
  ASSIGN_OR_RETURN(std::unique_ptr<Layer> attn,
                   LlamaAttention::Create(backend, prefix + "self_attn.",
                                          {.features = d,
                                           .heads = o.heads,
                                           .kv_heads = o.kv_heads,
                                           .head_dim = o.head_dim,
                                           .rope_theta = o.rope_theta,
                                           .rope_scaling = o.rope_scaling,
                                           .bias = o.attention_bias}));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> norm2,
      RmsNormLayer::Create(backend, prefix + "post_attention_layernorm.", d,
                           o.eps));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> mlp,
      SwiGluMlp::Create(backend, prefix + "mlp.", d, o.mlp_features));
  auto attn_branch = std::make_unique<Residual>(
      backend,
      std::make_unique<Chain>(LayerList(std::move(norm1), std::move(attn))));
  auto mlp_branch = std::make_unique<Residual>(
      backend,
      std::make_unique<Chain>(LayerList(std::move(norm2), std::move(mlp))));
  return std::make_unique<Chain>(
      LayerList(std::move(attn_branch), std::move(mlp_branch)));
}

}  // namespace conveyor::engine
