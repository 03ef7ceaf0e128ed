#include "engine/layers/row_bias.h"

#include <utility>

#include "common/status_macros.h"
#include "engine/layers/dense.h"

namespace conveyor::engine {

absl::StatusOr<std::unique_ptr<RowBias>> RowBias::Create(Backend* backend,
                                                         std::string name,
                                                         int64_t features) {
  std::unique_ptr<RowBias> layer(new RowBias(backend));
  ASSIGN_OR_RETURN(layer->bias_,
                   MakeParameter(backend, std::move(name), {features}));
  return layer;
}

absl::StatusOr<Tensor> RowBias::Forward(const Tensor& x, Stash& /*stash*/) {
  // A new tensor: x may be kept by the layer before.
  ASSIGN_OR_RETURN(Tensor y, backend_->Empty(x.shape(), x.dtype()));
  backend_->Copy(x, y);
  backend_->AddRowBias(y, bias_.value);
  return y;
}

absl::StatusOr<Tensor> RowBias::BackwardInput(const Tensor& dy,
                                              Stash& /*stash*/,
                                              bool /*need_dx*/) {
  return dy;
}

absl::Status RowBias::BackwardWeight(const Tensor& dy, Stash& /*stash*/) {
  backend_->SumRows(dy, 1.0f, bias_.grad);
  return absl::OkStatus();
}

}  // namespace conveyor::engine
