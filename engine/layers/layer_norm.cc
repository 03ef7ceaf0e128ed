#include "engine/layers/layer_norm.h"

#include "common/status_macros.h"
#include "engine/layers/dense.h"

namespace conveyor::engine {

absl::StatusOr<std::unique_ptr<LayerNormLayer>> LayerNormLayer::Create(
    Backend* backend, const std::string& prefix, int64_t features, float eps) {
  std::unique_ptr<LayerNormLayer> l(new LayerNormLayer(backend, eps));
  ASSIGN_OR_RETURN(l->weight_,
                   MakeParameter(backend, prefix + "weight", {features}));
  ASSIGN_OR_RETURN(l->bias_,
                   MakeParameter(backend, prefix + "bias", {features}));
  backend->Fill(l->weight_.value, 1.0f);
  return l;
}

absl::StatusOr<Tensor> LayerNormLayer::Forward(const Tensor& x, Stash& stash) {
  const Shape rows = {x.numel() / x.dim(-1)};
  ASSIGN_OR_RETURN(Tensor y, backend_->Empty(x.shape(), DType::kF32));
  ASSIGN_OR_RETURN(Tensor mean, backend_->Empty(rows, DType::kF32));
  ASSIGN_OR_RETURN(Tensor rstd, backend_->Empty(rows, DType::kF32));
  backend_->LayerNorm(x, weight_.value, bias_.value, eps_, y, mean, rstd);
  stash.saved = {x, mean, rstd};
  return y;
}

absl::StatusOr<Tensor> LayerNormLayer::BackwardInput(const Tensor& dy,
                                                     Stash& stash,
                                                     bool need_dx) {
  if (!need_dx) return Tensor();
  const Tensor& x = stash.saved[0];
  ASSIGN_OR_RETURN(Tensor dx, backend_->Empty(x.shape(), DType::kF32));
  backend_->LayerNormBackwardInput(x, weight_.value, stash.saved[1],
                                   stash.saved[2], dy, dx);
  return dx;
}

absl::Status LayerNormLayer::BackwardWeight(const Tensor& dy, Stash& stash) {
  backend_->LayerNormBackwardWeight(stash.saved[0], stash.saved[1],
                                    stash.saved[2], dy, weight_.grad,
                                    bias_.grad);
  return absl::OkStatus();
}

}  // namespace conveyor::engine
