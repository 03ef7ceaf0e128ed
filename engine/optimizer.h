// Optimizer: sgd (momentum, nesterov), adam and adamw with torch.optim
// semantics and defaults, a learning-rate schedule (constant, linear warmup,
// cosine), and optional global gradient-norm clipping
// (torch.nn.utils.clip_grad_norm_).
//
// Clipping is split so a pipeline can clip by the norm over all stages: each
// stage computes GradSquaredSum() over its own parameters, the caller sums
// those across stages, and passes the global norm to Step(). With one stage,
// Step() computes it itself. Thread-compatible.
#ifndef CONVEYOR_ENGINE_OPTIMIZER_H_
#define CONVEYOR_ENGINE_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/layer.h"

namespace conveyor::engine {

struct LrSchedule {
  enum class Kind { kConstant, kLinearWarmup, kCosine };
  Kind kind = Kind::kConstant;
  int64_t warmup_steps = 0;  // kLinearWarmup and kCosine.
  // kCosine: steps until min_lr; 0 means the job's training.steps, filled in
  // by ResolveSchedule before the optimizer is built.
  int64_t total_steps = 0;
  double min_lr = 0.0;  // kCosine.
};

struct OptimizerConfig {
  enum class Kind { kSgd, kAdam, kAdamW };
  Kind kind = Kind::kAdam;
  double lr = 1e-3;
  double momentum = 0.0, dampening = 0.0;         // sgd
  bool nesterov = false;                          // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  // torch defaults: 0 for sgd and adam, 0.01 for adamw. Unset: the default.
  std::optional<double> weight_decay = std::nullopt;
  LrSchedule schedule = {};
  std::optional<double> clip_grad_norm = std::nullopt;  // Max global L2 norm.
};

// Fills in the defaults that depend on the training length (cosine
// total_steps = 0 becomes training_steps).
void ResolveSchedule(OptimizerConfig& config, int64_t training_steps);

// The learning rate for step `step` (0-based) under `config`.
double LearningRate(const OptimizerConfig& config, int64_t step);

class Optimizer {
 public:
  // InvalidArgument for inconsistent settings (negative lr, nesterov without
  // momentum, betas outside [0, 1), cosine without total_steps, ...).
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      Backend* backend, const OptimizerConfig& config,
      std::vector<Parameter*> params);

  // Sum of squared gradients over this optimizer's parameters, tied copies
  // left out.
  absl::StatusOr<double> GradSquaredSum() const;

  // One update with the learning rate of the current step, then advances the
  // step. global_grad_norm: the norm over every stage's gradients (for
  // clipping); when absent and clipping is on, this optimizer's own norm.
  // Returns the gradient norm used (0 without clipping).
  absl::StatusOr<double> Step(std::optional<double> global_grad_norm = {});

  void ZeroGrad();
  int64_t step() const { return step_; }

  // What a checkpoint must hold for a resumed run to continue bitwise: the
  // step count (which sets the learning rate, bias correction and sgd's
  // first-step rule) and every state tensor, by slot name (torch's:
  // "momentum_buffer"; "exp_avg" and "exp_avg_sq") and parameter.
  struct StateTensor {
    std::string slot;
    const Parameter* param = nullptr;
    Tensor tensor;
  };
  std::vector<StateTensor> StateTensors() const;

  // Restores what StateTensors describes: sets the step count and fills
  // every state tensor with `read(slot, parameter)`, which returns its values
  // (row-major f32). InvalidArgument naming the slot and parameter when a
  // value count disagrees with the parameter's shape, or for a negative
  // step; read's own errors as they are.
  using StateReader = std::function<absl::StatusOr<std::vector<float>>(
      absl::string_view slot, const Parameter& param)>;
  absl::Status RestoreState(int64_t step, const StateReader& read);
  double current_lr() const { return LearningRate(config_, step_); }

 private:
  Optimizer(Backend* backend, OptimizerConfig config,
            std::vector<Parameter*> params)
      : backend_(backend), config_(config), params_(std::move(params)) {}

  Backend* backend_;
  OptimizerConfig config_;
  std::vector<Parameter*> params_;
  // Per parameter: sgd momentum buffer, or adam's exp_avg and exp_avg_sq.
  std::vector<Tensor> state1_, state2_;
  int64_t step_ = 0;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_OPTIMIZER_H_
