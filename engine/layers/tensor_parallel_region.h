// TensorParallelRegion: one rank's shard of a Megatron-style parallel
// sub-layer (engine/tensor_parallel.h). The inner layer is the rank's shard
// of a column-parallel projection and everything up to the matching
// row-parallel one (an attention's heads, an MLP's hidden units), whose
// output is a partial sum over the ranks:
//   forward:  y  = AllReduceSum(inner(x))      (x is replicated)
//   backward: dx = AllReduceSum(inner'(dy))    (dy is replicated)
// So each sub-layer costs one all-reduce forward and one backward, and its
// input and output stay replicated: the norms and residuals around it run
// whole on every rank and give every rank the same bits.
//
// Parameters are the inner layer's (shards, under their global names).
// Thread-compatible: each rank's thread runs its own region.
#ifndef CONVEYOR_ENGINE_LAYERS_TENSOR_PARALLEL_REGION_H_
#define CONVEYOR_ENGINE_LAYERS_TENSOR_PARALLEL_REGION_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/layer.h"
#include "engine/tensor_parallel.h"

namespace conveyor::engine {

class TensorParallelRegion final : public Layer {
 public:
  // `rank.group` outlives the layer.
  TensorParallelRegion(TensorParallelRank rank, std::unique_ptr<Layer> inner)
      : rank_(rank), inner_(std::move(inner)) {}

  std::vector<Parameter*> parameters() override { return inner_->parameters(); }
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override {
    return inner_->BackwardWeight(dy, stash);
  }
  void ReleaseForWeightBackward(Stash& stash) override {
    inner_->ReleaseForWeightBackward(stash);
  }

 private:
  // The sum over ranks of `partial`, in a new tensor: `partial` may be
  // something the inner layer keeps in its stash.
  absl::StatusOr<Tensor> Sum(const Tensor& partial);

  TensorParallelRank rank_;
  std::unique_ptr<Layer> inner_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_TENSOR_PARALLEL_REGION_H_
