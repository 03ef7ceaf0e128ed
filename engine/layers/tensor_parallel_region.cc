#include "engine/layers/tensor_parallel_region.h"

#include "common/status_macros.h"

namespace conveyor::engine {

absl::StatusOr<Tensor> TensorParallelRegion::Sum(const Tensor& partial) {
  if (rank_.size() == 1) return partial;
  ASSIGN_OR_RETURN(Tensor sum,
                   partial.backend()->Empty(partial.shape(), partial.dtype()));
  RETURN_IF_ERROR(rank_.group->AllReduceSum(rank_.rank, partial, sum));
  return sum;
}

absl::StatusOr<Tensor> TensorParallelRegion::Forward(const Tensor& x,
                                                     Stash& stash) {
  ASSIGN_OR_RETURN(Tensor partial, inner_->Forward(x, stash));
  return Sum(partial);
}

absl::StatusOr<Tensor> TensorParallelRegion::BackwardInput(const Tensor& dy,
                                                           Stash& stash,
                                                           bool need_dx) {
  ASSIGN_OR_RETURN(Tensor partial, inner_->BackwardInput(dy, stash, need_dx));
  // need_dx is the same on every rank, so either all reduce or none does.
  if (!partial.defined()) return partial;
  return Sum(partial);
}

}  // namespace conveyor::engine
