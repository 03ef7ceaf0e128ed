// LayerNormLayer: torch.nn.LayerNorm over the last dimension, with affine
// weight (ones) and bias (zeros). Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_LAYER_NORM_H_
#define CONVEYOR_ENGINE_LAYERS_LAYER_NORM_H_

#include <memory>
#include <string>

#include "engine/layer.h"

namespace conveyor::engine {

class LayerNormLayer final : public Layer {
 public:
  // Parameters "<prefix>weight" and "<prefix>bias".
  static absl::StatusOr<std::unique_ptr<LayerNormLayer>> Create(
      Backend* backend, const std::string& prefix, int64_t features, float eps);

  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;

 private:
  LayerNormLayer(Backend* backend, float eps) : backend_(backend), eps_(eps) {}

  Backend* backend_;
  float eps_;
  Parameter weight_, bias_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_LAYER_NORM_H_
