// Combinators that build composite layers from simpler ones, with forward,
// BI and BW derived mechanically, so composites need no hand-written
// backward:
//   Chain:    y = f_n(... f_1(x)); BI keeps each inner output gradient for BW.
//   Residual: y = x + f(x).
// A stage's layer list is a Chain too. Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_COMPOSITE_H_
#define CONVEYOR_ENGINE_LAYERS_COMPOSITE_H_

#include <memory>
#include <utility>
#include <vector>

#include "engine/layer.h"

namespace conveyor::engine {

class Chain final : public Layer {
 public:
  explicit Chain(std::vector<std::unique_ptr<Layer>> layers)
      : layers_(std::move(layers)) {}

  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  std::vector<Parameter*> parameters() override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;
  // Drops the output gradient and stash of every inner layer without
  // parameters; the others release their own.
  void ReleaseForWeightBackward(Stash& stash) override;

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
};

// The layers given, in order, as the vector a Chain takes:
//   std::make_unique<Chain>(LayerList(std::move(norm), std::move(attn))).
template <typename... L>
std::vector<std::unique_ptr<Layer>> LayerList(L&&... layers) {
  std::vector<std::unique_ptr<Layer>> v;
  (v.push_back(std::forward<L>(layers)), ...);
  return v;
}

class Residual final : public Layer {
 public:
  Residual(Backend* backend, std::unique_ptr<Layer> inner)
      : backend_(backend), inner_(std::move(inner)) {}

  std::vector<Parameter*> parameters() override { return inner_->parameters(); }
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;
  void ReleaseForWeightBackward(Stash& stash) override;

 private:
  Backend* backend_;
  std::unique_ptr<Layer> inner_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_COMPOSITE_H_
