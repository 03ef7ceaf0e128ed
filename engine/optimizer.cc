#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::engine {
namespace {

double WeightDecay(const OptimizerConfig& c) {
  if (c.weight_decay) return *c.weight_decay;
  return c.kind == OptimizerConfig::Kind::kAdamW ? 0.01 : 0.0;
}

}  // namespace

void ResolveSchedule(OptimizerConfig& config, int64_t training_steps) {
  if (config.schedule.kind == LrSchedule::Kind::kCosine &&
      config.schedule.total_steps == 0) {
    config.schedule.total_steps = training_steps;
  }
}

double LearningRate(const OptimizerConfig& c, int64_t step) {
  const LrSchedule& s = c.schedule;
  if (s.kind == LrSchedule::Kind::kConstant) return c.lr;
  if (step < s.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / s.warmup_steps;
  }
  if (s.kind == LrSchedule::Kind::kLinearWarmup) return c.lr;
  const double span = std::max<int64_t>(s.total_steps - s.warmup_steps, 1);
  const double progress =
      std::clamp(static_cast<double>(step - s.warmup_steps) / span, 0.0, 1.0);
  return s.min_lr + 0.5 * (c.lr - s.min_lr) *
                        (1.0 + std::cos(std::numbers::pi * progress));
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    Backend* backend, const OptimizerConfig& c,
    std::vector<Parameter*> params) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (!(c.lr >= 0))
    return bad(absl::StrCat("optimizer.lr must be >= 0, got ", c.lr));
  if (!(WeightDecay(c) >= 0)) return bad("optimizer.weight_decay must be >= 0");
  if (c.kind == OptimizerConfig::Kind::kSgd) {
    if (!(c.momentum >= 0)) return bad("optimizer.momentum must be >= 0");
    if (c.nesterov && (c.momentum <= 0 || c.dampening != 0)) {
      return bad("optimizer.nesterov needs momentum > 0 and dampening 0");
    }
  } else {
    if (!(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1)) {
      return bad("optimizer.betas must each be in [0, 1)");
    }
    if (!(c.eps >= 0)) return bad("optimizer.eps must be >= 0");
  }
  if (c.schedule.warmup_steps < 0)
    return bad("lr_schedule.warmup_steps must be >= 0");
  if (c.schedule.kind == LrSchedule::Kind::kCosine &&
      c.schedule.total_steps <= c.schedule.warmup_steps) {
    return bad("lr_schedule: cosine needs total_steps > warmup_steps");
  }
  if (c.clip_grad_norm && !(*c.clip_grad_norm > 0)) {
    return bad("optimizer.clip_grad_norm must be > 0");
  }
  std::unique_ptr<Optimizer> opt(new Optimizer(backend, c, std::move(params)));
  const bool needs_state2 = c.kind != OptimizerConfig::Kind::kSgd;
  const bool needs_state1 = needs_state2 || c.momentum != 0;
  for (Parameter* p : opt->params_) {
    Tensor s1, s2;
    if (needs_state1) {
      ASSIGN_OR_RETURN(s1, backend->Zeros(p->value.shape()));
    }
    if (needs_state2) {
      ASSIGN_OR_RETURN(s2, backend->Zeros(p->value.shape()));
    }
    opt->state1_.push_back(s1);
    opt->state2_.push_back(s2);
  }
  return opt;
}

absl::StatusOr<double> Optimizer::GradSquaredSum() const {
  double sum = 0;
  for (Parameter* p : params_) {
    // A tied copy's gradient is its original's (summed before the step):
    // counted once, as in a model that holds the parameter once.
    if (p->tied_copy) continue;
    ASSIGN_OR_RETURN(double s, backend_->SumSquares(p->grad));
    sum += s;
  }
  return sum;
}

absl::StatusOr<double> Optimizer::Step(std::optional<double> global_grad_norm) {
  double norm = 0;
  float grad_scale = 1.0f;  // Clipping's coefficient, when it clips.
  if (config_.clip_grad_norm) {
    if (global_grad_norm) {
      norm = *global_grad_norm;
    } else {
      ASSIGN_OR_RETURN(double sq, GradSquaredSum());
      norm = std::sqrt(sq);
    }
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6),
    // only when that is below 1.
    const double coef = *config_.clip_grad_norm / (norm + 1e-6);
    if (coef < 1.0) grad_scale = static_cast<float>(coef);
  }
  const float lr = static_cast<float>(LearningRate(config_, step_));
  const float wd = static_cast<float>(WeightDecay(config_));
  if (config_.kind == OptimizerConfig::Kind::kSgd) {
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter* p = params_[i];
      if (grad_scale != 1.0f) backend_->Scale(p->grad, grad_scale);
      backend_->SgdUpdate({.lr = lr,
                           .momentum = static_cast<float>(config_.momentum),
                           .dampening = static_cast<float>(config_.dampening),
                           .weight_decay = wd,
                           .nesterov = config_.nesterov,
                           .first_step = step_ == 0},
                          p->value, p->grad, state1_[i]);
    }
  } else {
    // Every parameter in one call: the clipping scale rides along, so a GPU
    // runs one launch per group of tensors instead of two per parameter.
    std::vector<AdamSlot> slots;
    slots.reserve(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      slots.push_back(
          {params_[i]->value, params_[i]->grad, state1_[i], state2_[i]});
    }
    backend_->AdamUpdateMany({.lr = lr,
                              .beta1 = static_cast<float>(config_.beta1),
                              .beta2 = static_cast<float>(config_.beta2),
                              .eps = static_cast<float>(config_.eps),
                              .weight_decay = wd,
                              .decoupled_weight_decay =
                                  config_.kind == OptimizerConfig::Kind::kAdamW,
                              .step = step_ + 1},
                             grad_scale, slots);
  }
  ++step_;
  // The GEMMs' bf16 copies follow the update: once a step, not per call.
  RefreshGemmCopies(params_);
  return norm;
}

namespace {

// torch.optim's state names, so a checkpoint reads like torch's state_dict.
constexpr absl::string_view kMomentumSlot = "momentum_buffer";
constexpr absl::string_view kExpAvgSlot = "exp_avg";
constexpr absl::string_view kExpAvgSqSlot = "exp_avg_sq";

}  // namespace

std::vector<Optimizer::StateTensor> Optimizer::StateTensors() const {
  const bool sgd = config_.kind == OptimizerConfig::Kind::kSgd;
  std::vector<StateTensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (state1_[i].defined()) {
      out.push_back({.slot = std::string(sgd ? kMomentumSlot : kExpAvgSlot),
                     .param = params_[i],
                     .tensor = state1_[i]});
    }
    if (state2_[i].defined()) {
      out.push_back({.slot = std::string(kExpAvgSqSlot),
                     .param = params_[i],
                     .tensor = state2_[i]});
    }
  }
  return out;
}

absl::Status Optimizer::RestoreState(int64_t step, const StateReader& read) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state: step ", step, " is negative"));
  }
  for (const StateTensor& s : StateTensors()) {
    ASSIGN_OR_RETURN(std::vector<float> values, read(s.slot, *s.param));
    if (static_cast<int64_t>(values.size()) != s.tensor.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state ", s.slot, " of '", s.param->name, "' has ",
          values.size(), " values; the parameter has ", s.tensor.numel()));
    }
    RETURN_IF_ERROR(backend_->CopyFromHost(
        values.data(), values.size() * sizeof(float), s.tensor));
  }
  step_ = step;
  return absl::OkStatus();
}

void Optimizer::ZeroGrad() {
  for (Parameter* p : params_) backend_->Fill(p->grad, 0.0f);
}

}  // namespace conveyor::engine
