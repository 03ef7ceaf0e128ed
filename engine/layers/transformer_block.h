// The transformer block of the JaxPP notebook (post-norm) or its pre-norm
// variant, built from the composite combinators:
//   post-norm: x = norm1(x + attn(x)); x = norm2(x + mlp(x))
//   pre-norm:  x = x + attn(norm1(x)); x = x + mlp(norm2(x))
// with mlp = Linear(d, mlp_features), GELU, Linear(mlp_features, d).
// Parameter names under <prefix>: attn.{in_proj_weight, in_proj_bias,
// out_proj.weight, out_proj.bias}, norm1.*, mlp.0.*, mlp.2.*, norm2.*.
#ifndef CONVEYOR_ENGINE_LAYERS_TRANSFORMER_BLOCK_H_
#define CONVEYOR_ENGINE_LAYERS_TRANSFORMER_BLOCK_H_

#include <memory>
#include <string>

#include "engine/layer.h"
#include "engine/tensor_parallel.h"

namespace conveyor::engine {

struct TransformerBlockOptions {
  int64_t features = 0;
  int64_t heads = 1;
  int64_t mlp_features = 0;
  bool causal = false;
  bool pre_norm = false;
  float eps = 1e-5f;
  bool gelu_tanh = false;
  // Whole block without a group; otherwise its shard on the rank, Megatron
  // style: in_proj's q, k and v rows and mlp.0 split by rows (the rank's
  // heads and hidden units), out_proj and mlp.2 by columns, each attention
  // and MLP in a TensorParallelRegion followed by its bias (added once);
  // heads and mlp_features must be multiples of the group's size.
  TensorParallelRank tensor_parallel = {};
};

absl::StatusOr<std::unique_ptr<Layer>> MakeTransformerBlock(
    Backend* backend, const std::string& prefix,
    const TransformerBlockOptions& options);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_TRANSFORMER_BLOCK_H_
