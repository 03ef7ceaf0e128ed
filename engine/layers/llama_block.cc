#include "engine/layers/llama_block.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/composite.h"
#include "engine/layers/llama_attention.h"
#include "engine/layers/rms_norm.h"
#include "engine/layers/swiglu.h"
#include "engine/layers/tensor_parallel_region.h"

namespace conveyor::engine {

absl::StatusOr<std::unique_ptr<Layer>> MakeLlamaBlock(
    Backend* backend, const std::string& prefix, const LlamaBlockOptions& o) {
  const int64_t d = o.features;
  const TensorParallelRank& tp = o.tensor_parallel;
  const int64_t t = tp.size();
  for (const auto& [name, count] :
       {std::pair<const char*, int64_t>{"heads", o.heads},
        {"kv_heads", o.kv_heads},
        {"mlp_features", o.mlp_features}}) {
    if (count % t != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": ", name, " (", count,
                       ") does not split over ", t, " tensor-parallel ranks"));
    }
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> norm1,
      RmsNormLayer::Create(backend, prefix + "input_layernorm.", d, o.eps));
  // A shard has fewer heads, so its head size must be given, not derived
  // from its own head count (an uneven split is LlamaAttention's error).
  const int64_t head_dim =
      t > 1 && o.head_dim == 0 && o.heads > 0 && d % o.heads == 0 ? d / o.heads
                                                                  : o.head_dim;
  ASSIGN_OR_RETURN(std::unique_ptr<Layer> attn,
                   LlamaAttention::Create(backend, prefix + "self_attn.",
                                          {.features = d,
                                           .heads = o.heads / t,
                                           .kv_heads = o.kv_heads / t,
                                           .head_dim = head_dim,
                                           .rope_theta = o.rope_theta,
                                           .rope_scaling = o.rope_scaling,
                                           .bias = o.attention_bias}));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> norm2,
      RmsNormLayer::Create(backend, prefix + "post_attention_layernorm.", d,
                           o.eps));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> mlp,
      SwiGluMlp::Create(backend, prefix + "mlp.", d, o.mlp_features / t));
  if (t > 1) {
    attn = std::make_unique<TensorParallelRegion>(tp, std::move(attn));
    mlp = std::make_unique<TensorParallelRegion>(tp, std::move(mlp));
  }
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
