// Stage: the layers of one pipeline stage of a model, built on a backend and
// run one microbatch action at a time: Forward(mb), BackwardInput(mb),
// BackwardWeight(mb), or Backward(mb) for both. This is what a worker runs
// for each action of its schedule, and what the in-process reference trainer
// runs for every stage in turn. It is the one-device PipelineStage
// (engine/pipeline_stage.h); engine::MeshStage runs several, data parallel.
//
// Per microbatch the stage keeps the stash from forward until BI, then only
// what BW reads (Layer::ReleaseForWeightBackward) until BW, then nothing; so a
// zero-bubble schedule that holds BWs back holds no more than it must. With
// remat, forward keeps only the stage's input and backward recomputes the
// activations first; results are identical because every kernel is
// deterministic. The stage tracks live and peak activation bytes.
// Thread-compatible: one thread drives a stage.
#ifndef CONVEYOR_ENGINE_STAGE_H_
#define CONVEYOR_ENGINE_STAGE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/layers/composite.h"
#include "engine/model_spec.h"
#include "engine/parameter_source.h"
#include "engine/pipeline_stage.h"
#include "engine/safetensors.h"
#include "engine/tensor_parallel.h"

namespace conveyor::engine {

class Stage : public PipelineStage {
 public:
  // Builds layers [spec.stage_begin[stage], spec.StageEnd(stage)) with zeroed
  // parameters; with a tensor-parallel `rank`, its shard of each layer that
  // splits (engine/tensor_parallel_stage.h drives such stages, and fills
  // their parameters: InitializeFromSeed and LoadFrom expect whole ones).
  // InvalidArgument for an out-of-range stage.
  static absl::StatusOr<std::unique_ptr<Stage>> Create(
      Backend* backend, const ModelSpec& spec, int stage,
      const TensorParallelRank& rank = {});

  // Fills every parameter from the spec's seed: a function of the seed and
  // the parameter's global name only, so any split gives the same values.
  absl::Status InitializeFromSeed(uint64_t seed) override;
  // Loads every parameter from `source` by global name (its errors as they
  // come: InvalidArgument naming a tensor that is missing, not a float, or
  // shaped differently).
  absl::Status LoadFrom(const ParameterSource& source) override;

  std::vector<Parameter*> parameters() override { return chain_.parameters(); }
  int index() const override { return index_; }
  bool is_first() const { return index_ == 0; }

  absl::Status SetDocuments(int microbatch,
                            MicrobatchDocuments documents) override;
  absl::StatusOr<Tensor> Forward(int microbatch, const Tensor& x) override;
  // dx for the previous stage (undefined on the first stage).
  absl::StatusOr<Tensor> BackwardInput(int microbatch,
                                       const Tensor& dy) override;
  // Accumulates parameter gradients and frees the microbatch's activations.
  absl::Status BackwardWeight(int microbatch) override;
  absl::StatusOr<Tensor> Backward(int microbatch, const Tensor& dy);
  absl::StatusOr<Tensor> Evaluate(int label, const Tensor& x) override;

  // Forgets every microbatch in flight (after a failed step, so the next
  // step starts clean).
  void DropInFlight() override {
    states_.clear();
    pending_documents_.clear();
  }

  // Microbatches forwarded but not yet through BW.
  int in_flight() const override { return static_cast<int>(states_.size()); }
  size_t live_activation_bytes() const override;
  size_t peak_activation_bytes() const override { return peak_bytes_; }
  void ResetPeakActivationBytes() override {
    peak_bytes_ = live_activation_bytes();
  }

 private:
  struct MicrobatchState {
    Tensor input;  // Kept under remat only.
    Stash stash;   // After BI, only what BW reads.
    bool stash_ready = false;
    bool input_backward_done = false;  // BI ran; BW is due.
    // Current for the layers during each action (engine/documents.h).
    DeviceDocuments documents;
  };

  Stage(Backend* backend, int index, bool remat,
        std::vector<std::unique_ptr<Layer>> layers,
        std::map<std::string, const ParamSpec*> specs)
      : backend_(backend),
        index_(index),
        remat_(remat),
        chain_(std::move(layers)),
        specs_(std::move(specs)) {}

  absl::StatusOr<MicrobatchState*> State(int microbatch, const char* action);
  // The documents SetDocuments gave `microbatch`, or none.
  DeviceDocuments TakeDocuments(int microbatch);
  void NotePeak();

  Backend* backend_;
  int index_;
  bool remat_;
  Chain chain_;
  std::map<std::string, const ParamSpec*> specs_;  // By parameter name.
  std::map<int, MicrobatchState> states_;
  // Given by SetDocuments, taken by the microbatch's Forward or Evaluate.
  std::map<int, DeviceDocuments> pending_documents_;
  size_t peak_bytes_ = 0;
};

// CheckInitTensor for every parameter of `model` (every stage): a job's
// model.init.from checked before anything is allocated (conveyorctl
// validate).
absl::Status CheckInitFileFitsModel(const SafetensorsReader& file,
                                    const ModelSpec& model);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_STAGE_H_
