#include "engine/loss.h"

#include "common/status_macros.h"

namespace conveyor::engine {

absl::StatusOr<LossResult> ComputeLoss(Backend* backend, LossKind kind,
                                       const Tensor& y, const Tensor& target,
                                       float grad_scale) {
  LossResult r;
  ASSIGN_OR_RETURN(r.grad, backend->Empty(y.shape(), DType::kF32));
  if (kind == LossKind::kMse) {
    ASSIGN_OR_RETURN(r.loss, backend->MseLoss(y, target, grad_scale, r.grad));
  } else {
    ASSIGN_OR_RETURN(r.loss,
                     backend->CrossEntropyLoss(y, target, grad_scale, r.grad));
  }
  return r;
}

}  // namespace conveyor::engine
