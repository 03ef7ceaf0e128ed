#include "engine/layers/activation.h"

#include "common/status_macros.h"

namespace conveyor::engine {

absl::StatusOr<Tensor> Activation::Forward(const Tensor& x, Stash& stash) {
  ASSIGN_OR_RETURN(Tensor y, backend_->Empty(x.shape(), DType::kF32));
  if (kind_ == Kind::kRelu) {
    backend_->Relu(x, y);
  } else {
    backend_->Gelu(x, kind_ == Kind::kGeluTanh, y);
  }
  stash.saved = {x};
  return y;
}

absl::StatusOr<Tensor> Activation::BackwardInput(const Tensor& dy, Stash& stash,
                                                 bool need_dx) {
  if (!need_dx) return Tensor();
  const Tensor& x = stash.saved[0];
  ASSIGN_OR_RETURN(Tensor dx, backend_->Empty(x.shape(), DType::kF32));
  if (kind_ == Kind::kRelu) {
    backend_->ReluBackward(x, dy, dx);
  } else {
    backend_->GeluBackward(x, kind_ == Kind::kGeluTanh, dy, dx);
  }
  return dx;
}

}  // namespace conveyor::engine
