#include "worker/stage_executor.h"

#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/loss.h"

namespace conveyor::worker {

using engine::Tensor;
using scheduler::Action;
using scheduler::Op;
using transport::TensorKind;

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    const ExecutorConfig& config, std::map<int, engine::Stage*> stages,
    engine::DataSource* data, engine::Optimizer* optimizer,
    transport::Channel* channel, engine::Backend* backend) {
  if (config.num_ranks < 1 || config.num_stages < config.num_ranks ||
      config.num_stages % config.num_ranks != 0 || config.rank < 0 ||
      config.rank >= config.num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor: rank ", config.rank, " of ", config.num_ranks,
                     " with ", config.num_stages, " stages is inconsistent"));
  }
  if (config.microbatches < 1 || config.batch_size % config.microbatches != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor: batch_size ", config.batch_size,
        " is not a multiple of microbatches ", config.microbatches));
  }
  for (const auto& [index, stage] : stages) {
    if (index % config.num_ranks != config.rank || stage->index() != index) {
      return absl::InvalidArgumentError(absl::StrCat(
          "executor: stage ", index, " does not belong on rank ", config.rank));
    }
  }
  return std::unique_ptr<StageExecutor>(new StageExecutor(
      config, std::move(stages), data, optimizer, channel, backend));
}

transport::Tag StageExecutor::MakeTag(int64_t step, int mb, int stage,
                                      TensorKind kind) const {
  return {.job = config_.job,
          .step = step,
          .microbatch = mb,
          .stage = stage,
          .kind = kind};
}

absl::StatusOr<Tensor> StageExecutor::Receive(const transport::Tag& tag) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Tensor> t = channel_->Recv(tag, config_.recv_timeout);
  wait_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return t;
}

absl::Status StageExecutor::Forward(int64_t step, const Action& a) {
  engine::Stage* stage = stages_.at(a.stage);
  const int m = config_.microbatches;
  Tensor x;
  if (a.stage == 0) {
    ASSIGN_OR_RETURN(
        x, data_->Inputs(backend_, step, a.microbatch, m, config_.batch_size));
  } else {
    ASSIGN_OR_RETURN(x, Receive(MakeTag(step, a.microbatch, a.stage - 1,
                                        TensorKind::kActivation)));
  }
  ASSIGN_OR_RETURN(Tensor y, stage->Forward(a.microbatch, x));
  if (a.stage + 1 < config_.num_stages) {
    return channel_->Send(
        (a.stage + 1) % config_.num_ranks,
        MakeTag(step, a.microbatch, a.stage, TensorKind::kActivation), y);
  }
  // Last stage: the loss and its gradient, scaled by 1/M so the step's
  // gradient is that of the mean loss over the batch.
  ASSIGN_OR_RETURN(Tensor target, data_->Targets(backend_, step, a.microbatch,
                                                 m, config_.batch_size));
  ASSIGN_OR_RETURN(
      engine::LossResult loss,
      engine::ComputeLoss(backend_, config_.loss, y, target, 1.0f / m));
  loss_sum_ += loss.loss;
  loss_grads_[a.microbatch] = loss.grad;
  return absl::OkStatus();
}

absl::Status StageExecutor::BackwardInput(int64_t step, const Action& a) {
  engine::Stage* stage = stages_.at(a.stage);
  Tensor dy;
  if (a.stage + 1 == config_.num_stages) {
    auto it = loss_grads_.find(a.microbatch);
    if (it == loss_grads_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", config_.rank, ": backward of the last stage for microbatch ",
          a.microbatch, " before its forward"));
    }
    dy = std::move(it->second);
    loss_grads_.erase(it);
  } else {
    ASSIGN_OR_RETURN(dy, Receive(MakeTag(step, a.microbatch, a.stage + 1,
                                         TensorKind::kGradient)));
  }
  ASSIGN_OR_RETURN(Tensor dx, stage->BackwardInput(a.microbatch, dy));
  if (a.stage == 0) return absl::OkStatus();
  return channel_->Send(
      (a.stage - 1) % config_.num_ranks,
      MakeTag(step, a.microbatch, a.stage, TensorKind::kGradient), dx);
}

absl::StatusOr<RankStepResult> StageExecutor::RunStep(
    int64_t step, const std::vector<Action>& actions,
    const AllReduceSum& all_reduce) {
  absl::StatusOr<RankStepResult> result = RunActions(step, actions, all_reduce);
  if (!result.ok()) {
    for (auto& [index, stage] : stages_) stage->DropInFlight();
  }
  return result;
}

absl::StatusOr<RankStepResult> StageExecutor::RunActions(
    int64_t step, const std::vector<Action>& actions,
    const AllReduceSum& all_reduce) {
  const auto start = std::chrono::steady_clock::now();
  loss_sum_ = 0;
  wait_seconds_ = 0;
  loss_grads_.clear();
  optimizer_->ZeroGrad();
  RankStepResult result;
  for (auto& [index, stage] : stages_) stage->ResetPeakActivationBytes();
  for (const Action& a : actions) {
    if (!stages_.count(a.stage)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", config_.rank, " has no stage ", a.stage,
                       " for ", scheduler::ToString(a)));
    }
    absl::Status s;
    switch (a.op) {
      case Op::kForward:
        s = Forward(step, a);
        break;
      case Op::kBackward:
        s = BackwardInput(step, a);
        if (s.ok()) s = stages_.at(a.stage)->BackwardWeight(a.microbatch);
        break;
      case Op::kBackwardInput:
        s = BackwardInput(step, a);
        break;
      case Op::kBackwardWeight:
        s = stages_.at(a.stage)->BackwardWeight(a.microbatch);
        break;
    }
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("rank ", config_.rank, ", step ", step, ", ",
                                 scheduler::ToString(a), ": ", s.message()));
    }
  }
  for (auto& [index, stage] : stages_) {
    if (stage->in_flight() != 0) {
      return absl::InternalError(absl::StrCat(
          "rank ", config_.rank, ": stage ", index, " still holds ",
          stage->in_flight(), " microbatches after the step's actions"));
    }
    result.peak_activation_bytes += stage->peak_activation_bytes();
  }
  std::optional<double> global_norm;
  if (all_reduce) {
    ASSIGN_OR_RETURN(double local, optimizer_->GradSquaredSum());
    ASSIGN_OR_RETURN(double total, all_reduce(local));
    global_norm = std::sqrt(total);
  }
  ASSIGN_OR_RETURN(result.grad_norm, optimizer_->Step(global_norm));
  RETURN_IF_ERROR(backend_->Synchronize());
  result.has_loss = stages_.count(config_.num_stages - 1) > 0;
  result.loss = loss_sum_ / config_.microbatches;
  result.wait_seconds = wait_seconds_;
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return result;
}

}  // namespace conveyor::worker
