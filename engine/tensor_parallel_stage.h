// TensorParallelStage: one pipeline stage run over a worker's mesh of D
// devices as D/T replicas of T tensor-parallel ranks (`pipeline:
// {devices_per_stage: D, tensor_parallel: T}`). Device d is rank d % T of
// replica d / T: tensor parallelism innermost, as Megatron and TorchTitan
// place it, since its ranks talk in every layer and the replicas once a step.
//
// Each rank holds its shard of every layer whose kind splits (engine/
// layer_kinds.h's build_shard: llama_block, Megatron style) and a whole copy
// of the others. All D ranks run each action at once, each on its own thread
// (engine/internal/rank_threads.h), and meet in their replica's
// TensorParallelGroup. A microbatch's rows are split over the replicas;
// every rank of a replica gets the replica's rows, and the replica's output
// is its rank 0's (every rank holds the same bits). To its neighbours the
// stage looks like one Stage on device 0.
//
// Parameters stay whole: a master copy on device 0 is parameters(). The
// optimizer steps it, and checkpoints, exports and the gradient norm read it
// under the global names, exactly as for a stage on one device, so a job
// resumes across any T (and P, D, schedule). BeforeOptimizerStep gathers the
// ranks' gradients into it: a shard's into its slice, summed over the
// replicas; a whole parameter's from each replica's rank 0 (all ranks of a
// replica compute the same gradient for it, from replicated activations).
// AfterOptimizerStep slices the new values back to the ranks. The price is
// a whole copy of the stage's parameters, gradients and optimizer state on
// device 0: the compute and the activations split T ways, the parameter
// bytes do not yet.
//
// Thread-compatible: one thread drives the stage.
#ifndef CONVEYOR_ENGINE_TENSOR_PARALLEL_STAGE_H_
#define CONVEYOR_ENGINE_TENSOR_PARALLEL_STAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/internal/rank_threads.h"
#include "engine/mesh_collective.h"
#include "engine/model_spec.h"
#include "engine/pipeline_stage.h"
#include "engine/stage.h"
#include "engine/tensor_parallel.h"
#include "engine/tensor_parallel_layout.h"

namespace conveyor::engine {

class TensorParallelStage final : public PipelineStage {
 public:
  // `tensor_parallel` (T) divides collective->size() and passes
  // CheckTensorParallel; InvalidArgument otherwise. `collective` outlives
  // the stage.
  static absl::StatusOr<std::unique_ptr<TensorParallelStage>> Create(
      MeshCollective* collective, const ModelSpec& spec, int stage,
      int tensor_parallel);

  // Into the master, then sliced to the ranks.
  absl::Status InitializeFromSeed(uint64_t seed) override;
  absl::Status LoadFrom(const ParameterSource& source) override;

  int index() const override { return index_; }
  std::vector<Parameter*> parameters() override {
    return master_->parameters();
  }
  int tensor_parallel() const { return tensor_parallel_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  // The rank on device d (tests, diagnostics).
  Stage* rank(int device) const { return ranks_.at(device).get(); }

  absl::Status SetDocuments(int microbatch,
                            MicrobatchDocuments documents) override;
  absl::StatusOr<Tensor> Forward(int microbatch, const Tensor& x) override;
  absl::StatusOr<Tensor> BackwardInput(int microbatch,
                                       const Tensor& dy) override;
  absl::Status BackwardWeight(int microbatch) override;
  absl::StatusOr<Tensor> Evaluate(int label, const Tensor& x) override;

  // Also zeroes the ranks' gradients (the failed step's partial sums).
  void DropInFlight() override;

  int in_flight() const override { return ranks_[0]->in_flight(); }
  // Summed over the ranks (they move in step, as MeshStage's replicas).
  size_t live_activation_bytes() const override;
  size_t peak_activation_bytes() const override;
  void ResetPeakActivationBytes() override;

  // Gathers the ranks' gradients into the master's, then zeroes theirs.
  absl::Status BeforeOptimizerStep() override;
  // Slices the master's parameters to the ranks.
  absl::Status AfterOptimizerStep() override;

 private:
  // How the ranks split a parameter: along `dim` (-1: every rank holds it
  // whole), which stacks `blocks` equal blocks each split alike.
  struct Split {
    int dim = -1;
    int64_t blocks = 1;
  };

  TensorParallelStage(MeshCollective* collective, int index,
                      int tensor_parallel, std::unique_ptr<Stage> master,
                      std::vector<std::unique_ptr<TensorParallelGroup>> groups,
                      std::vector<std::unique_ptr<Stage>> ranks,
                      std::vector<Split> splits);

  int replicas() const { return size() / tensor_parallel_; }
  // `x`'s rows split over the replicas, each replica's part on each of its
  // ranks' devices: the input of rank d is element d.
  absl::StatusOr<std::vector<Tensor>> ToRanks(const Tensor& x, int microbatch,
                                              const char* what);
  // Every replica's rank-0 result, rows concatenated on device 0.
  absl::StatusOr<Tensor> FromReplicas(const std::vector<Tensor>& per_rank);
  // fn(d) on every rank at once; any failure aborts every group's
  // collectives, and the groups are ready again afterwards.
  absl::Status RunRanks(absl::FunctionRef<absl::Status(int)> fn);
  absl::Status SliceParametersToRanks();
  // [device][parameter], each rank's in master_->parameters() order.
  std::vector<std::vector<Parameter*>> RankParameters();
  void ZeroRankGradients();

  MeshCollective* collective_;
  int index_;
  int tensor_parallel_;
  std::unique_ptr<Stage> master_;
  std::vector<std::unique_ptr<TensorParallelGroup>> groups_;  // By replica.
  std::vector<std::unique_ptr<Stage>> ranks_;                 // By device.
  // By parameter (master_->parameters() order).
  std::vector<Split> splits_;
  RankThreads threads_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_TENSOR_PARALLEL_STAGE_H_
