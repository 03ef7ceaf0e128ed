// InProcessTrainer: trains a whole job in one process, every stage in turn,
// with the same microbatching a pipeline uses. This is the numerical
// reference that pipelined runs must match.
//
// Step semantics: the step's loss is the mean over the global batch; each
// microbatch's loss gradient is scaled by 1/M and gradients accumulate over
// the M microbatches, so one step equals one full-batch step on the mean loss
// (the Alpa tutorial's check), up to float reassociation. Then the optimizer
// steps once, with gradient-norm clipping over all stages if configured.
// Thread-compatible.
#ifndef CONVEYOR_JOB_TRAINER_H_
#define CONVEYOR_JOB_TRAINER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/data.h"
#include "engine/evaluation.h"
#include "engine/optimizer.h"
#include "engine/stage.h"
#include "job/job_spec.h"

namespace conveyor::job {

struct StepReport {
  int64_t step = 0;  // 1-based.
  double loss = 0;   // Mean over the global batch.
  double seconds = 0;
  double samples_per_second = 0;
  double learning_rate = 0;
  // The global L2 norm of the step's gradients before clipping (a tied
  // parameter once), as the pipelined run reports it.
  double grad_norm = 0;
  size_t peak_activation_bytes = 0;  // Over all stages, this step.
  // The backend's memory peaks over the step (all stages share it).
  engine::MemoryStats memory;
  // The evaluation after this step, when the job's eval section has one
  // due (EvalSpec::DueAfter).
  std::optional<engine::EvalResult> eval;
};

class InProcessTrainer {
 public:
  // Builds every stage of job.model, initializes (seed or init.from), opens
  // the data source and the optimizer.
  static absl::StatusOr<std::unique_ptr<InProcessTrainer>> Create(
      engine::Backend* backend, const JobSpec& job);

  // One training step.
  absl::StatusOr<StepReport> Step();

  // One evaluation pass over the job's eval data (engine/evaluation.h) with
  // the current parameters; FailedPrecondition for a job without an eval
  // section. The reference for the pipelined RunEvaluation.
  absl::StatusOr<engine::EvalResult> Evaluate();

  // job.training.steps steps, each followed by its evaluation when one is
  // due, calling on_step after each.
  absl::Status Run(const std::function<void(const StepReport&)>& on_step);

  // Every parameter, with global names, as one safetensors file.
  absl::Status SaveParameters(const std::string& path) const;

  std::vector<engine::Parameter*> parameters() const;
  int64_t steps_done() const { return step_; }

 private:
  absl::StatusOr<StepReport> RunStep();

  InProcessTrainer(engine::Backend* backend, JobSpec job)
      : backend_(backend), job_(std::move(job)) {}

  engine::Backend* backend_;
  JobSpec job_;
  std::vector<std::unique_ptr<engine::Stage>> stages_;
  // Each tied parameter's original and copy (ModelSpec::TiedParameters()).
  std::vector<std::pair<engine::Parameter*, engine::Parameter*>> tied_;
  std::unique_ptr<engine::DataSource> data_;
  std::unique_ptr<engine::DataSource> eval_data_;  // With an eval section.
  std::unique_ptr<engine::Optimizer> optimizer_;
  int64_t step_ = 0;
};

// Copies the parameters to the host and writes them as one safetensors file
// (atomically), tagged with `metadata`. Tied copies are left out: the file
// holds each parameter once, as its original.
absl::Status SaveParameters(engine::Backend* backend,
                            const std::vector<engine::Parameter*>& params,
                            const std::string& path,
                            const std::map<std::string, std::string>& metadata);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_TRAINER_H_
