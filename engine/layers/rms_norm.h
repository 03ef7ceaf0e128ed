// RmsNormLayer: HF's LlamaRMSNorm over the last dimension, y = weight * x /
// sqrt(mean(x^2) + eps), with a weight (ones) and no bias. Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_RMS_NORM_H_
#define CONVEYOR_ENGINE_LAYERS_RMS_NORM_H_

#include <memory>
#include <string>

#include "engine/layer.h"

namespace conveyor::engine {

class RmsNormLayer final : public Layer {
 public:
  // Parameter "<prefix>weight".
  static absl::StatusOr<std::unique_ptr<RmsNormLayer>> Create(
      Backend* backend, const std::string& prefix, int64_t features, float eps);

  std::vector<Parameter*> parameters() override { return {&weight_}; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;

 private:
  RmsNormLayer(Backend* backend, float eps) : backend_(backend), eps_(eps) {}

  Backend* backend_;
  float eps_;
  Parameter weight_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_RMS_NORM_H_
