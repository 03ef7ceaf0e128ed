// The decoder layer of Llama-family models (HF's LlamaDecoderLayer), built
// from the composite combinators:
//   x = x + self_attn(input_layernorm(x))
//   x = x + mlp(post_attention_layernorm(x))
// with RMS norms, grouped-query attention with rotary embedding
// (engine/layers/llama_attention.h) and the SwiGLU MLP
// (engine/layers/swiglu.h). Parameter names under <prefix> are HF's:
// input_layernorm.weight, self_attn.{q,k,v,o}_proj.weight (and q, k, v
// biases with attention_bias), post_attention_layernorm.weight,
// mlp.{gate,up,down}_proj.weight, in that order.
//
// With a tensor-parallel rank (engine/tensor_parallel.h), the block is that
// rank's shard, Megatron style: q, k, v (and their biases) and gate, up are
// split by rows (column-parallel: the rank's query heads, key/value heads and
// hidden units), o and down by columns (row-parallel), each attention and
// MLP wrapped in a TensorParallelRegion; the norms are whole on every rank.
#ifndef CONVEYOR_ENGINE_LAYERS_LLAMA_BLOCK_H_
#define CONVEYOR_ENGINE_LAYERS_LLAMA_BLOCK_H_

#include <memory>
#include <string>

#include "engine/layer.h"
#include "engine/rope.h"
#include "engine/tensor_parallel.h"

namespace conveyor::engine {

struct LlamaBlockOptions {
  int64_t features = 0;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  // 0: features / heads (LlamaAttentionOptions).
  int64_t head_dim = 0;
  int64_t mlp_features = 0;
  float eps = 1e-6f;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = {};
  bool attention_bias = false;
  // Whole block without a group; otherwise heads, kv_heads and
  // mlp_features must be multiples of its size (InvalidArgument).
  TensorParallelRank tensor_parallel = {};
};

absl::StatusOr<std::unique_ptr<Layer>> MakeLlamaBlock(
    Backend* backend, const std::string& prefix,
    const LlamaBlockOptions& options);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_LLAMA_BLOCK_H_
