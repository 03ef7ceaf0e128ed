// Parameter-free activations: ReLU and GELU (torch.nn.ReLU, torch.nn.GELU
// with approximate "none" or "tanh"). Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_ACTIVATION_H_
#define CONVEYOR_ENGINE_LAYERS_ACTIVATION_H_

#include "engine/layer.h"

namespace conveyor::engine {

class Activation final : public Layer {
 public:
  enum class Kind { kRelu, kGelu, kGeluTanh };
  Activation(Backend* backend, Kind kind) : backend_(backend), kind_(kind) {}

  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;

 private:
  Backend* backend_;
  Kind kind_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_ACTIVATION_H_
