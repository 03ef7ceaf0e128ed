// The loss a model trains with: mse (mean over all elements, float targets of
// the output's shape) or cross_entropy (logits [..., classes], integer class
// ids of the output's shape without its last dimension, mean over them).
// Shared by the model spec and the loss kernels. Thread-safe.
#ifndef CONVEYOR_ENGINE_LOSS_KIND_H_
#define CONVEYOR_ENGINE_LOSS_KIND_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace conveyor::engine {

enum class LossKind {
  kMse,
  kCrossEntropy,
};

// A cross_entropy target that takes no part in the loss: its row's gradient
// is 0 and the mean runs over the other rows (torch's ignore_index). Data
// sources write it where a target is masked (data.documents.eod_mask_loss).
inline constexpr int64_t kIgnoredTarget = -1;

// "mse", "cross_entropy".
inline absl::string_view LossKindName(LossKind loss) {
  return loss == LossKind::kMse ? "mse" : "cross_entropy";
}

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LOSS_KIND_H_
