#include "engine/layers/transformer_block.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/activation.h"
#include "engine/layers/attention.h"
#include "engine/layers/composite.h"
#include "engine/layers/dense.h"
#include "engine/layers/layer_norm.h"
#include "engine/layers/row_bias.h"
#include "engine/layers/tensor_parallel_region.h"

namespace conveyor::engine {
namespace {

std::unique_ptr<Layer> MakeChain(std::vector<std::unique_ptr<Layer>> layers) {
  return std::make_unique<Chain>(std::move(layers));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeTransformerBlock(
    Backend* backend, const std::string& prefix,
    const TransformerBlockOptions& o) {
  const int64_t d = o.features;
  const TensorParallelRank& tp = o.tensor_parallel;
  const int64_t t = tp.size();
  if (o.heads % t != 0 || o.mlp_features % t != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": heads (", o.heads, ") and mlp_features (", o.mlp_features,
        ") must split over ", t, " tensor-parallel ranks"));
  }
  // A shard holds heads / t heads and mlp_features / t hidden units; its
  // row-parallel projections (out_proj, mlp.2) leave their bias to a RowBias
  // after the all-reduce, which adds it once.
  ASSIGN_OR_RETURN(std::unique_ptr<Layer> attn,
                   SelfAttention::Create(backend, prefix + "attn.", d,
                                         o.heads / t, d / t, o.causal,
                                         /*bias=*/true, /*out_bias=*/t == 1));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> norm1,
      LayerNormLayer::Create(backend, prefix + "norm1.", d, o.eps));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> norm2,
      LayerNormLayer::Create(backend, prefix + "norm2.", d, o.eps));
  ASSIGN_OR_RETURN(std::unique_ptr<Layer> up,
                   Dense::Create(backend, prefix + "mlp.0.", d,
                                 o.mlp_features / t, /*bias=*/true));
  ASSIGN_OR_RETURN(std::unique_ptr<Layer> down,
                   Dense::Create(backend, prefix + "mlp.2.", o.mlp_features / t,
                                 d, /*bias=*/t == 1));
  auto gelu = std::make_unique<Activation>(
      backend,
      o.gelu_tanh ? Activation::Kind::kGeluTanh : Activation::Kind::kGelu);
  auto mlp =
      MakeChain(LayerList(std::move(up), std::move(gelu), std::move(down)));
  if (t > 1) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<Layer> attn_bias,
        RowBias::Create(backend, prefix + "attn.out_proj.bias", d));
    ASSIGN_OR_RETURN(std::unique_ptr<Layer> mlp_bias,
                     RowBias::Create(backend, prefix + "mlp.2.bias", d));
    attn = MakeChain(
        LayerList(std::make_unique<TensorParallelRegion>(tp, std::move(attn)),
                  std::move(attn_bias)));
    mlp = MakeChain(
        LayerList(std::make_unique<TensorParallelRegion>(tp, std::move(mlp)),
                  std::move(mlp_bias)));
  }
  // Parameter order: attn, norm1, mlp, norm2 for post-norm; norm1, attn,
  // norm2, mlp for pre-norm. Stages match parameters to the spec by name.
  if (o.pre_norm) {
    auto attn_branch = std::make_unique<Residual>(
        backend, MakeChain(LayerList(std::move(norm1), std::move(attn))));
    auto mlp_branch = std::make_unique<Residual>(
        backend, MakeChain(LayerList(std::move(norm2), std::move(mlp))));
    return MakeChain(LayerList(std::move(attn_branch), std::move(mlp_branch)));
  }
  auto attn_branch = std::make_unique<Residual>(backend, std::move(attn));
  auto mlp_branch = std::make_unique<Residual>(backend, std::move(mlp));
  return MakeChain(LayerList(std::move(attn_branch), std::move(norm1),
                             std::move(mlp_branch), std::move(norm2)));
}

}  // namespace conveyor::engine
