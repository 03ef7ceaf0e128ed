#include "engine/layers/rms_norm.h"

#include "common/status_macros.h"
#include "engine/layers/dense.h"

namespace conveyor::engine {

absl::StatusOr<std::unique_ptr<RmsNormLayer>> RmsNormLayer::Create(
    Backend* backend, const std::string& prefix, int64_t features, float eps) {
  std::unique_ptr<RmsNormLayer> l(new RmsNormLayer(backend, eps));
  ASSIGN_OR_RETURN(l->weight_,
                   MakeParameter(backend, prefix + "weight", {features}));
  backend->Fill(l->weight_.value, 1.0f);
  return l;
}

absl::StatusOr<Tensor> RmsNormLayer::Forward(const Tensor& x, Stash& stash) {
  ASSIGN_OR_RETURN(Tensor y, backend_->Empty(x.shape(), DType::kF32));
  ASSIGN_OR_RETURN(Tensor rstd,
                   backend_->Empty({x.numel() / x.dim(-1)}, DType::kF32));
  backend_->RmsNorm(x, weight_.value, eps_, y, rstd);
  stash.saved = {x, rstd};
  return y;
}

absl::StatusOr<Tensor> RmsNormLayer::BackwardInput(const Tensor& dy,
                                                   Stash& stash, bool need_dx) {
  if (!need_dx) return Tensor();
  const Tensor& x = stash.saved[0];
  ASSIGN_OR_RETURN(Tensor dx, backend_->Empty(x.shape(), DType::kF32));
  backend_->RmsNormBackwardInput(x, weight_.value, stash.saved[1], dy, dx);
  return dx;
}

absl::Status RmsNormLayer::BackwardWeight(const Tensor& dy, Stash& stash) {
  backend_->RmsNormBackwardWeight(stash.saved[0], stash.saved[1], dy,
                                  weight_.grad);
  return absl::OkStatus();
}

}  // namespace conveyor::engine
