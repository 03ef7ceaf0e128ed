// SwiGluMlp: HF's LlamaMLP, y = down(silu(gate(x)) * up(x)), three Linear
// layers without bias: gate_proj.weight [m, d], up_proj.weight [m, d],
// down_proj.weight [d, m]. Input and output [..., d]. Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_SWIGLU_H_
#define CONVEYOR_ENGINE_LAYERS_SWIGLU_H_

#include <memory>
#include <string>

#include "engine/layer.h"

namespace conveyor::engine {

class SwiGluMlp final : public Layer {
 public:
  // Parameters "<prefix>gate_proj.weight", "<prefix>up_proj.weight" and
  // "<prefix>down_proj.weight", in that order (HF's registration order).
  static absl::StatusOr<std::unique_ptr<SwiGluMlp>> Create(
      Backend* backend, const std::string& prefix, int64_t features,
      int64_t mlp_features);

  std::vector<Parameter*> parameters() override {
    return {&gate_, &up_, &down_};
  }
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;
  void ReleaseForWeightBackward(Stash& stash) override;

 private:
  SwiGluMlp(Backend* backend, int64_t features, int64_t mlp_features)
      : backend_(backend), features_(features), mlp_features_(mlp_features) {}

  Backend* backend_;
  int64_t features_, mlp_features_;
  Parameter gate_, up_, down_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_SWIGLU_H_
