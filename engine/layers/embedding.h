// Embedding: torch.nn.Embedding over token ids [B, S] (I64), plus optional
// learned positions: y[b, s] = weight[ids[b, s]] + position.weight[s].
// There is no input gradient (ids are data). Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_EMBEDDING_H_
#define CONVEYOR_ENGINE_LAYERS_EMBEDDING_H_

#include <memory>
#include <string>

#include "engine/layer.h"

namespace conveyor::engine {

class Embedding final : public Layer {
 public:
  // Parameters "<prefix>weight" [vocab, features] and, when max_positions >
  // 0, "<prefix>position.weight" [max_positions, features].
  static absl::StatusOr<std::unique_ptr<Embedding>> Create(
      Backend* backend, const std::string& prefix, int64_t vocab,
      int64_t features, int64_t max_positions);

  std::vector<Parameter*> parameters() override;
  absl::StatusOr<Tensor> Forward(const Tensor& ids, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;

 private:
  Embedding(Backend* backend, int64_t features, int64_t max_positions)
      : backend_(backend), features_(features), max_positions_(max_positions) {}

  Backend* backend_;
  int64_t features_, max_positions_;
  Parameter weight_, position_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_EMBEDDING_H_
