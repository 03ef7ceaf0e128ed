#include "engine/layers/transformer_block.h"

#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "engine/layers/activation.h"
#include "engine/layers/attention.h"
#include "engine/layers/composite.h"
#include "engine/layers/dense.h"
#include "engine/layers/layer_norm.h"

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
  ASSIGN_OR_RETURN(std::unique_ptr<Layer> attn,
                   SelfAttention::Create(backend, prefix + "attn.", d, o.heads,
                                         d, o.causal, /*bias=*/true));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> norm1,
      LayerNormLayer::Create(backend, prefix + "norm1.", d, o.eps));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Layer> norm2,
      LayerNormLayer::Create(backend, prefix + "norm2.", d, o.eps));
  ASSIGN_OR_RETURN(std::unique_ptr<Layer> up,
                   Dense::Create(backend, prefix + "mlp.0.", d, o.mlp_features,
                                 /*bias=*/true));
  ASSIGN_OR_RETURN(std::unique_ptr<Layer> down,
                   Dense::Create(backend, prefix + "mlp.2.", o.mlp_features, d,
                                 /*bias=*/true));
  auto gelu = std::make_unique<Activation>(
      backend,
      o.gelu_tanh ? Activation::Kind::kGeluTanh : Activation::Kind::kGelu);
  auto mlp =
      MakeChain(LayerList(std::move(up), std::move(gelu), std::move(down)));
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
