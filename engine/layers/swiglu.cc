#include "engine/layers/swiglu.h"

#include "common/status_macros.h"
#include "engine/layers/dense.h"

namespace conveyor::engine {

absl::StatusOr<std::unique_ptr<SwiGluMlp>> SwiGluMlp::Create(
    Backend* backend, const std::string& prefix, int64_t features,
    int64_t mlp_features) {
  std::unique_ptr<SwiGluMlp> l(new SwiGluMlp(backend, features, mlp_features));
  ASSIGN_OR_RETURN(l->gate_, MakeParameter(backend, prefix + "gate_proj.weight",
                                           {mlp_features, features}));
  ASSIGN_OR_RETURN(l->up_, MakeParameter(backend, prefix + "up_proj.weight",
                                         {mlp_features, features}));
  ASSIGN_OR_RETURN(l->down_, MakeParameter(backend, prefix + "down_proj.weight",
                                           {features, mlp_features}));
  return l;
}

// Stash: saved = {x, gate, up, hidden}; BI adds output_grads = {dgate, dup}.
absl::StatusOr<Tensor> SwiGluMlp::Forward(const Tensor& x, Stash& stash) {
  CONVEYOR_CHECK(x.dim(-1) == features_, "swiglu input has the wrong width");
  Backend& be = *backend_;
  const Shape inner = WithLastDim(x.shape(), mlp_features_);
  ASSIGN_OR_RETURN(Tensor gate, be.Empty(inner, DType::kF32));
  ASSIGN_OR_RETURN(Tensor up, be.Empty(inner, DType::kF32));
  ASSIGN_OR_RETURN(Tensor hidden, be.Empty(inner, DType::kF32));
  ASSIGN_OR_RETURN(Tensor y, be.Empty(x.shape(), DType::kF32));
  be.Gemm(false, true, 1.0f, x, gate_.gemm_value(), 0.0f, gate);
  be.Gemm(false, true, 1.0f, x, up_.gemm_value(), 0.0f, up);
  be.SiluMul(gate, up, hidden);
  be.Gemm(false, true, 1.0f, hidden, down_.gemm_value(), 0.0f, y);
  stash.saved = {x, gate, up, hidden};
  return y;
}

absl::StatusOr<Tensor> SwiGluMlp::BackwardInput(const Tensor& dy, Stash& stash,
                                                bool need_dx) {
  const Tensor &x = stash.saved[0], &gate = stash.saved[1],
               &up = stash.saved[2];
  Backend& be = *backend_;
  ASSIGN_OR_RETURN(Tensor d_hidden, be.Empty(gate.shape(), DType::kF32));
  ASSIGN_OR_RETURN(Tensor d_gate, be.Empty(gate.shape(), DType::kF32));
  ASSIGN_OR_RETURN(Tensor d_up, be.Empty(gate.shape(), DType::kF32));
  be.Gemm(false, false, 1.0f, dy, down_.gemm_value(), 0.0f, d_hidden);
  be.SiluMulBackward(gate, up, d_hidden, d_gate, d_up);
  stash.output_grads = {d_gate, d_up};
  if (!need_dx) return Tensor();
  ASSIGN_OR_RETURN(Tensor dx, be.Empty(x.shape(), DType::kF32));
  be.Gemm(false, false, 1.0f, d_gate, gate_.gemm_value(), 0.0f, dx);
  be.Gemm(false, false, 1.0f, d_up, up_.gemm_value(), 1.0f, dx);
  return dx;
}

void SwiGluMlp::ReleaseForWeightBackward(Stash& stash) {
  // BW reads x, hidden and the two gradients; gate and up were for BI.
  if (stash.saved.size() == 4) {
    stash.saved[1] = Tensor();
    stash.saved[2] = Tensor();
  }
}

absl::Status SwiGluMlp::BackwardWeight(const Tensor& dy, Stash& stash) {
  const Tensor &x = stash.saved[0], &hidden = stash.saved[3];
  const Tensor &d_gate = stash.output_grads[0], &d_up = stash.output_grads[1];
  backend_->Gemm(true, false, 1.0f, dy, hidden, 1.0f, down_.grad);
  backend_->Gemm(true, false, 1.0f, d_gate, x, 1.0f, gate_.grad);
  backend_->Gemm(true, false, 1.0f, d_up, x, 1.0f, up_.grad);
  return absl::OkStatus();
}

}  // namespace conveyor::engine
