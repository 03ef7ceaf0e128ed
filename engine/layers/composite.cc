#include "engine/layers/composite.h"

#include "common/status_macros.h"

namespace conveyor::engine {

std::vector<Parameter*> Chain::parameters() {
  std::vector<Parameter*> all;
  for (auto& layer : layers_) {
    for (Parameter* p : layer->parameters()) all.push_back(p);
  }
  return all;
}

absl::StatusOr<Tensor> Chain::Forward(const Tensor& x, Stash& stash) {
  stash.children.assign(layers_.size(), Stash());
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    ASSIGN_OR_RETURN(h, layers_[i]->Forward(h, stash.children[i]));
  }
  return h;
}

absl::StatusOr<Tensor> Chain::BackwardInput(const Tensor& dy, Stash& stash,
                                            bool need_dx) {
  stash.output_grads.assign(layers_.size(), Tensor());
  Tensor g = dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    // Layer i's BW needs the gradient of its output, which is g here.
    stash.output_grads[i] = g;
    ASSIGN_OR_RETURN(
        g, layers_[i]->BackwardInput(g, stash.children[i], need_dx || i > 0));
  }
  return g;
}

absl::Status Chain::BackwardWeight(const Tensor& /*dy*/, Stash& stash) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    RETURN_IF_ERROR(
        layers_[i]->BackwardWeight(stash.output_grads[i], stash.children[i]));
  }
  return absl::OkStatus();
}

void Chain::ReleaseForWeightBackward(Stash& stash) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (i >= stash.children.size() || i >= stash.output_grads.size()) break;
    if (layers_[i]->parameters().empty()) {
      stash.output_grads[i] = Tensor();
      stash.children[i] = Stash();
    } else {
      layers_[i]->ReleaseForWeightBackward(stash.children[i]);
    }
  }
}

absl::StatusOr<Tensor> Residual::Forward(const Tensor& x, Stash& stash) {
  stash.children.assign(1, Stash());
  ASSIGN_OR_RETURN(Tensor fx, inner_->Forward(x, stash.children[0]));
  ASSIGN_OR_RETURN(Tensor y, backend_->Empty(x.shape(), DType::kF32));
  backend_->Add(x, fx, y);
  return y;
}

absl::StatusOr<Tensor> Residual::BackwardInput(const Tensor& dy, Stash& stash,
                                               bool need_dx) {
  ASSIGN_OR_RETURN(Tensor d_inner,
                   inner_->BackwardInput(dy, stash.children[0], need_dx));
  if (!need_dx) return Tensor();
  ASSIGN_OR_RETURN(Tensor dx, backend_->Empty(dy.shape(), DType::kF32));
  backend_->Add(dy, d_inner, dx);
  return dx;
}

absl::Status Residual::BackwardWeight(const Tensor& dy, Stash& stash) {
  return inner_->BackwardWeight(dy, stash.children[0]);
}

void Residual::ReleaseForWeightBackward(Stash& stash) {
  if (!stash.children.empty()) {
    inner_->ReleaseForWeightBackward(stash.children[0]);
  }
}

}  // namespace conveyor::engine
