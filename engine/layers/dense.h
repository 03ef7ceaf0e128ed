// Dense: torch.nn.Linear. y = x W^T + b over the last dimension, with
// W [out, in] and b [out]. Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_DENSE_H_
#define CONVEYOR_ENGINE_LAYERS_DENSE_H_

#include <memory>
#include <string>

#include "engine/layer.h"

namespace conveyor::engine {

class Dense final : public Layer {
 public:
  // Parameters "<prefix>weight" and "<prefix>bias" (zeroed; init fills them).
  static absl::StatusOr<std::unique_ptr<Dense>> Create(
      Backend* backend, const std::string& prefix, int64_t in, int64_t out,
      bool bias);
  // A Linear without bias whose weight [out, in] is a tied copy
  // (Parameter::tied_copy) of another layer's parameter `weight_name`: a
  // tied lm_head's copy of the embedding.
  static absl::StatusOr<std::unique_ptr<Dense>> CreateTiedCopy(
      Backend* backend, std::string weight_name, int64_t in, int64_t out);

  std::vector<Parameter*> parameters() override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;

 private:
  Dense(Backend* backend, int64_t in, int64_t out)
      : backend_(backend), in_(in), out_(out) {}

  Backend* backend_;
  int64_t in_, out_;
  Parameter weight_, bias_;
  bool has_bias_ = false;
};

// Creates a named parameter with zeroed value and grad.
absl::StatusOr<Parameter> MakeParameter(Backend* backend, std::string name,
                                        const Shape& shape);

// Shape of x with the last dimension replaced.
Shape WithLastDim(const Shape& shape, int64_t last);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_DENSE_H_
