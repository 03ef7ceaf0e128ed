// Losses: mse (mean over all elements) and cross_entropy (mean over tokens),
// as torch.nn.functional. One call gives a microbatch's mean loss and its
// gradient, scaled by grad_scale: a step over M microbatches passes 1/M, so
// the accumulated gradient is that of the mean loss over the whole batch.
// Thread-compatible.
#ifndef CONVEYOR_ENGINE_LOSS_H_
#define CONVEYOR_ENGINE_LOSS_H_

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/loss_kind.h"

namespace conveyor::engine {

struct LossResult {
  float loss = 0;  // Mean over the microbatch.
  Tensor grad;     // dL/dy * grad_scale, shaped like y.
};

// y: the model output; target: same shape (mse) or I64 ids of y's shape
// without its last dimension (cross_entropy). InvalidArgument when the target
// does not fit (it comes from data).
absl::StatusOr<LossResult> ComputeLoss(Backend* backend, LossKind kind,
                                       const Tensor& y, const Tensor& target,
                                       float grad_scale);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LOSS_H_
