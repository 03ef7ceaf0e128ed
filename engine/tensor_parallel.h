// TensorParallelGroup: the T devices of a worker's mesh that hold one replica
// of a stage between them, Megatron style (`pipeline.tensor_parallel`,
// engine/tensor_parallel_stage.h). Each device runs its shard of every layer
// on its own thread, and the layers meet in the group's collectives: a
// row-parallel projection's partial outputs are summed (AllReduceSum), and so
// are a column-parallel projection's partial input gradients.
//
// Every rank calls each collective once, in the same order, from its own
// thread; a call returns when every rank has made it. So that a rank which
// fails before reaching a collective cannot leave the others waiting forever,
// whoever drives the ranks calls Abort, which fails every waiting and later
// call until Reset.
//
// Results are the same bits on every rank: sums run on the host in rank
// order, whatever the timing. That keeps the replicated activations (norms,
// residuals) identical across the group, so the ranks never drift apart.
//
// CreateHostTensorParallelGroup stages through host memory, so it serves any
// backends: CPU meshes (CI) and a GPU listed more than once in a mesh
// (`cuda:0,cuda:0`, which runs the TP kernels end to end on one GPU). NCCL
// groups for meshes of distinct GPUs are not built yet.
//
// Thread-safe: that is its purpose.
#ifndef CONVEYOR_ENGINE_TENSOR_PARALLEL_H_
#define CONVEYOR_ENGINE_TENSOR_PARALLEL_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tensor.h"

namespace conveyor::engine {

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;

  // Ranks in the group (>= 1).
  virtual int size() const = 0;

  // `out` = the sum over ranks of each rank's `x` (f32, one shape on every
  // rank; `out` shaped as `x`, on the rank's device, and may be `x`).
  virtual absl::Status AllReduceSum(int rank, const Tensor& x,
                                    const Tensor& out) = 0;
  // Dimension 0 of every rank's `x` split into size() equal blocks: `out`
  // (one block's shape) = block `rank` of the sum over ranks.
  virtual absl::Status ReduceScatterRows(int rank, const Tensor& x,
                                         const Tensor& out) = 0;
  // `out` = the ranks' `x` concatenated along dimension 0, in rank order
  // (any dtype).
  virtual absl::Status AllGatherRows(int rank, const Tensor& x,
                                     const Tensor& out) = 0;

  // Fails every waiting and later collective with `why` (Aborted when OK)
  // until Reset.
  virtual void Abort(const absl::Status& why) = 0;
  // Ready for the next action. Call only while no rank is inside a
  // collective.
  virtual void Reset() = 0;
};

// The group a layer's shard belongs to, and its place in it. The default is
// no group: a whole layer, on one device.
struct TensorParallelRank {
  TensorParallelGroup* group = nullptr;
  int rank = 0;

  int size() const { return group == nullptr ? 1 : group->size(); }
};

// `size` ranks (>= 1), staged through host memory. InvalidArgument for a
// size below 1.
absl::StatusOr<std::unique_ptr<TensorParallelGroup>>
CreateHostTensorParallelGroup(int size);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_TENSOR_PARALLEL_H_
