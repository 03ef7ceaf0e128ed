#include "engine/layers/dense.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::engine {

absl::StatusOr<Parameter> MakeParameter(Backend* backend, std::string name,
                                        const Shape& shape) {
  Parameter p;
  p.name = std::move(name);
  ASSIGN_OR_RETURN(p.value, backend->Zeros(shape));
  ASSIGN_OR_RETURN(p.grad, backend->Zeros(shape));
  return p;
}

Shape WithLastDim(const Shape& shape, int64_t last) {
  Shape out = shape;
  out.back() = last;
  return out;
}

absl::StatusOr<std::unique_ptr<Dense>> Dense::Create(Backend* backend,
                                                     const std::string& prefix,
                                                     int64_t in, int64_t out,
                                                     bool bias) {
  std::unique_ptr<Dense> d(new Dense(backend, in, out));
  ASSIGN_OR_RETURN(d->weight_,
                   MakeParameter(backend, prefix + "weight", {out, in}));
  if (bias) {
    ASSIGN_OR_RETURN(d->bias_, MakeParameter(backend, prefix + "bias", {out}));
    d->has_bias_ = true;
  }
  return d;
}

absl::StatusOr<std::unique_ptr<Dense>> Dense::CreateTiedCopy(
    Backend* backend, std::string weight_name, int64_t in, int64_t out) {
  std::unique_ptr<Dense> d(new Dense(backend, in, out));
  ASSIGN_OR_RETURN(d->weight_,
                   MakeParameter(backend, std::move(weight_name), {out, in}));
  d->weight_.tied_copy = true;
  return d;
}

std::vector<Parameter*> Dense::parameters() {
  if (has_bias_) return {&weight_, &bias_};
  return {&weight_};
}

absl::StatusOr<Tensor> Dense::Forward(const Tensor& x, Stash& stash) {
  CONVEYOR_CHECK(x.dim(-1) == in_, "dense input has the wrong width");
  ASSIGN_OR_RETURN(Tensor y,
                   backend_->Empty(WithLastDim(x.shape(), out_), DType::kF32));
  backend_->Gemm(false, true, 1.0f, x, weight_.gemm_value(), 0.0f, y);
  if (has_bias_) backend_->AddRowBias(y, bias_.value);
  stash.saved = {x};
  return y;
}

absl::StatusOr<Tensor> Dense::BackwardInput(const Tensor& dy, Stash& stash,
                                            bool need_dx) {
  if (!need_dx) return Tensor();
  const Tensor& x = stash.saved[0];
  ASSIGN_OR_RETURN(Tensor dx, backend_->Empty(x.shape(), DType::kF32));
  backend_->Gemm(false, false, 1.0f, dy, weight_.gemm_value(), 0.0f, dx);
  return dx;
}

absl::Status Dense::BackwardWeight(const Tensor& dy, Stash& stash) {
  const Tensor& x = stash.saved[0];
  backend_->Gemm(true, false, 1.0f, dy, x, 1.0f, weight_.grad);
  if (has_bias_) backend_->SumRows(dy, 1.0f, bias_.grad);
  return absl::OkStatus();
}

}  // namespace conveyor::engine
