// PipelineStage: what a rank's executor (worker/stage_executor.h) needs of
// one pipeline stage: run its microbatch actions, expose the parameters the
// optimizer updates, and account for activation memory. engine::Stage runs a
// stage on one device; engine::MeshStage runs it data parallel over the
// devices of a mesh, behind the same interface, so the executor and its
// schedules do not know how many devices a stage uses.
//
// The two optimizer hooks let a stage with replicas keep them in step: the
// executor calls BeforeOptimizerStep() after the step's last action and
// before the gradient norm and the update (a mesh sums its replicas'
// gradients into parameters()), and AfterOptimizerStep() after the update (a
// mesh copies the updated parameters to the other replicas). A single-device
// stage has nothing to do in either.
//
// Thread-compatible: one thread drives a stage.
#ifndef CONVEYOR_ENGINE_PIPELINE_STAGE_H_
#define CONVEYOR_ENGINE_PIPELINE_STAGE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/documents.h"
#include "engine/layer.h"
#include "engine/tensor.h"

namespace conveyor::engine {

class ParameterSource;

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;

  // Global stage index in the model.
  virtual int index() const = 0;
  // The initial parameters: drawn from `seed` exactly as the in-process
  // reference draws them, or read by name from a file or checkpoint.
  virtual absl::Status InitializeFromSeed(uint64_t seed) = 0;
  virtual absl::Status LoadFrom(const ParameterSource& source) = 0;
  // The parameters the optimizer steps, checkpoints hold and the gradient
  // norm covers; their gradients are complete only after
  // BeforeOptimizerStep().
  virtual std::vector<Parameter*> parameters() = 0;

  // The documents packed into microbatch `microbatch` (engine/documents.h),
  // given before its Forward (or its Evaluate, under the label) and kept
  // with it until its weight backward. Without a call the microbatch has
  // none: positions run 0..seq-1 and attention spans the whole row.
  // InvalidArgument for a malformed layout.
  virtual absl::Status SetDocuments(int microbatch,
                                    MicrobatchDocuments documents) = 0;

  virtual absl::StatusOr<Tensor> Forward(int microbatch, const Tensor& x) = 0;
  // dx for the previous stage (undefined on the first stage).
  virtual absl::StatusOr<Tensor> BackwardInput(int microbatch,
                                               const Tensor& dy) = 0;
  // Accumulates parameter gradients and frees the microbatch's activations.
  virtual absl::Status BackwardWeight(int microbatch) = 0;

  // y = f(x) keeping nothing: an evaluation's forward. Bitwise equal to
  // Forward's output (the same kernels); in_flight() and the activation
  // accounting stay as they were, since nothing outlives the call. `label`
  // names the microbatch in errors.
  virtual absl::StatusOr<Tensor> Evaluate(int label, const Tensor& x) = 0;

  // Forgets every microbatch in flight (after a failed step, so the next
  // step starts clean).
  virtual void DropInFlight() = 0;

  // Microbatches forwarded but not yet through BW.
  virtual int in_flight() const = 0;
  virtual size_t live_activation_bytes() const = 0;
  virtual size_t peak_activation_bytes() const = 0;
  virtual void ResetPeakActivationBytes() = 0;

  // See the file comment. Called once per step each, in that order.
  virtual absl::Status BeforeOptimizerStep() { return absl::OkStatus(); }
  virtual absl::Status AfterOptimizerStep() { return absl::OkStatus(); }
};

// The parameter of `stage` named `name` that is (copy) or is not a tied
// copy, or nullptr.
Parameter* FindParameter(PipelineStage& stage, const std::string& name,
                         bool copy);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_PIPELINE_STAGE_H_
