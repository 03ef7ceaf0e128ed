// RowBias: y = x + b, b [features] added to every row of [..., features].
// What a tensor-parallel shard of a row-parallel projection leaves to run
// after its all-reduce (engine/layers/tensor_parallel_region.h): the bias
// belongs to the sum, so it is added once, on every rank alike, under the
// whole layer's parameter name (out_proj.bias, mlp.2.bias).
// Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_ROW_BIAS_H_
#define CONVEYOR_ENGINE_LAYERS_ROW_BIAS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/layer.h"

namespace conveyor::engine {

class RowBias final : public Layer {
 public:
  // The parameter `name` [features], zeroed.
  static absl::StatusOr<std::unique_ptr<RowBias>> Create(Backend* backend,
                                                         std::string name,
                                                         int64_t features);

  std::vector<Parameter*> parameters() override { return {&bias_}; }
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  // dx = dy.
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  // grad += dy summed over rows.
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;
  // BW reads only dy: nothing to keep.
  void ReleaseForWeightBackward(Stash& stash) override { stash = Stash(); }

 private:
  explicit RowBias(Backend* backend) : backend_(backend) {}

  Backend* backend_;
  Parameter bias_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_ROW_BIAS_H_
