// MeshStage: one pipeline stage run data parallel over the devices of a
// worker's mesh. It keeps one replica (an engine::Stage) per device; each
// microbatch's rows are split evenly over the replicas, in device order, and
// the replicas' outputs and input gradients are gathered back onto device 0,
// so to its neighbours the stage looks like one Stage on device 0.
//
// Why splitting rows is exact: dimension 0 of every tensor that flows
// between layers is the sample (a [batch, features] row for MLPs, a whole
// [batch, seq, features] sequence or a [batch, seq] row of token ids for
// transformers), and every layer treats samples independently (dense,
// activations and layer norm per row of the last dimension; attention within
// one sequence; embeddings per token, with positions broadcast over samples).
// So each replica's outputs are the full stage's rows, and every weight
// gradient, a sum over rows, splits into per-replica partial sums. The loss
// is computed by the executor on the gathered microbatch, so the output
// gradient rows already carry the full microbatch's scaling: the replicas'
// gradients simply add up (BeforeOptimizerStep) to the single-device ones,
// up to the order of the additions.
//
// parameters() are replica 0's: the optimizer steps them (on device 0), and
// checkpoints and the gradient norm read them. AfterOptimizerStep copies
// them to the other replicas.
//
// Activation bytes are summed over the replicas. The replicas run the same
// actions on equally shaped shards, so their live bytes move in step and the
// sum of their peaks is the peak of the sum.
//
// Thread-compatible: one thread drives a stage; the replicas run one after
// the other on that thread (their backends may queue the work
// asynchronously).
#ifndef CONVEYOR_ENGINE_MESH_STAGE_H_
#define CONVEYOR_ENGINE_MESH_STAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/mesh_collective.h"
#include "engine/model_spec.h"
#include "engine/pipeline_stage.h"
#include "engine/safetensors.h"
#include "engine/stage.h"

namespace conveyor::engine {

class MeshStage final : public PipelineStage {
 public:
  // One Stage::Create(collective->backend(d), spec, stage) per device, with
  // zeroed parameters. `collective` outlives the stage.
  static absl::StatusOr<std::unique_ptr<MeshStage>> Create(
      MeshCollective* collective, const ModelSpec& spec, int stage);

  // As Stage's, into replica 0, then copied to the others so every replica
  // starts identical.
  absl::Status InitializeFromSeed(uint64_t seed) override;
  absl::Status LoadFrom(const ParameterSource& source) override;

  int size() const { return static_cast<int>(replicas_.size()); }
  // The replica on device d (tests, diagnostics).
  Stage* replica(int device) const { return replicas_.at(device).get(); }

  int index() const override { return index_; }
  std::vector<Parameter*> parameters() override {
    return replicas_[0]->parameters();
  }

  // `x` is on device 0's backend or the host CPU backend; its dim(0) must be
  // a multiple of size() (InvalidArgument otherwise). The output is on
  // device 0.
  // Each replica gets the rows of its share of the microbatch.
  absl::Status SetDocuments(int microbatch,
                            MicrobatchDocuments documents) override;
  absl::StatusOr<Tensor> Forward(int microbatch, const Tensor& x) override;
  // `dy` as x; dx on device 0 (undefined on the first stage).
  absl::StatusOr<Tensor> BackwardInput(int microbatch,
                                       const Tensor& dy) override;
  absl::Status BackwardWeight(int microbatch) override;
  // Split as Forward; nothing kept on any replica.
  absl::StatusOr<Tensor> Evaluate(int label, const Tensor& x) override;

  // Also zeroes the other replicas' gradients: the failed step's partial
  // sums would otherwise leak into the next step, whose ZeroGrad reaches
  // only parameters() (replica 0).
  void DropInFlight() override;

  int in_flight() const override { return replicas_[0]->in_flight(); }
  size_t live_activation_bytes() const override;
  size_t peak_activation_bytes() const override;
  void ResetPeakActivationBytes() override;

  // Sums every replica's gradients into replica 0's, then zeroes the
  // others' (they are consumed; zeroing now rather than after the update
  // leaves nothing stale if the update fails).
  absl::Status BeforeOptimizerStep() override;
  // Copies replica 0's parameters to the others.
  absl::Status AfterOptimizerStep() override;

 private:
  MeshStage(MeshCollective* collective, int index,
            std::vector<std::unique_ptr<Stage>> replicas)
      : collective_(collective),
        index_(index),
        replicas_(std::move(replicas)) {}

  // x's rows split into size() shards, shard d on device d.
  absl::StatusOr<std::vector<Tensor>> Scatter(const Tensor& x, int microbatch,
                                              const char* what);
  // The shards' rows concatenated in device order, on device 0.
  absl::StatusOr<Tensor> Gather(const std::vector<Tensor>& parts);
  // [parameter][device] of the parameters' values or gradients.
  std::vector<std::vector<Tensor>> PerParameter(bool grads);
  absl::Status BroadcastParameters();
  void ZeroOtherGradients();

  MeshCollective* collective_;
  int index_;
  std::vector<std::unique_ptr<Stage>> replicas_;  // By device.
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_MESH_STAGE_H_
