#include "worker/stage_executor.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "engine/boundary_precision.h"
#include "engine/loss.h"
#include "job/microbatch_documents.h"

namespace conveyor::worker {

using engine::Tensor;
using scheduler::Action;
using scheduler::Op;
using telemetry::SpanKind;
using telemetry::SpanRecorder;
using transport::TensorKind;

namespace {

SpanKind KindOf(Op op) {
  switch (op) {
    case Op::kForward:
      return SpanKind::kForward;
    case Op::kBackward:
      return SpanKind::kBackward;
    case Op::kBackwardInput:
      return SpanKind::kBackwardInput;
    case Op::kBackwardWeight:
      return SpanKind::kBackwardWeight;
  }
  return SpanKind::kForward;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    const ExecutorConfig& config, std::map<int, engine::PipelineStage*> stages,
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
    if (index < 0 || index >= config.num_stages ||
        scheduler::StageRank(config.placement, index, config.num_ranks) !=
            config.rank ||
        stage->index() != index) {
      return absl::InvalidArgumentError(absl::StrCat(
          "executor: stage ", index, " does not belong on rank ", config.rank));
    }
  }
  std::unique_ptr<StageExecutor> executor(new StageExecutor(
      config, std::move(stages), data, optimizer, channel, backend));
  for (const auto& [index, stage] : executor->stages_) {
    int64_t params = 0;
    for (const engine::Parameter* p : stage->parameters()) {
      params += p->value.numel();
    }
    executor->stage_params_[index] = params;
  }
  return executor;
}

transport::Tag StageExecutor::TiedTag(int64_t step, int slot,
                                      int sender) const {
  return {.job = config_.job,
          .step = step,
          .microbatch = slot,
          .stage = sender,
          .kind = TensorKind::kPartialSum};
}

transport::Tag StageExecutor::MakeTag(int64_t step, int mb, int stage,
                                      TensorKind kind) const {
  return {.job = config_.job,
          .step = step,
          .microbatch = mb,
          .stage = stage,
          .kind = kind};
}

void StageExecutor::ZeroGradsOnce() {
  if (grads_zeroed_) return;
  optimizer_->ZeroGrad();
  spans_.Record(SpanKind::kOptimizer);
  grads_zeroed_ = true;
}

absl::StatusOr<Tensor> StageExecutor::Receive(const transport::Tag& tag,
                                              int for_stage) {
  ZeroGradsOnce();
  absl::StatusOr<Tensor> t = channel_->Recv(tag, config_.recv_timeout);
  spans_.Record(SpanKind::kRecvWait, for_stage, tag.microbatch,
                RankOf(tag.stage), t.ok() ? t->bytes() : 0);
  if (!t.ok()) return t;
  return engine::FromBoundary(*t);
}

absl::Status StageExecutor::SendTo(int to, const transport::Tag& tag,
                                   const Tensor& tensor) {
  absl::StatusOr<Tensor> sent = engine::ToBoundary(tensor, config_.precision);
  if (!sent.ok()) return sent.status();
  absl::Status s = channel_->Send(to, tag, *sent);
  spans_.Record(SpanKind::kSend, tag.stage, tag.microbatch, to, sent->bytes());
  return s;
}

absl::Status StageExecutor::Forward(int64_t step, const Action& a) {
  engine::PipelineStage* stage = stages_.at(a.stage);
  const int m = config_.microbatches;
  Tensor x;
  if (a.stage == 0) {
    absl::StatusOr<Tensor> inputs =
        data_->Inputs(backend_, step, a.microbatch, m, config_.batch_size);
    spans_.Record(SpanKind::kData, a.stage, a.microbatch);
    ASSIGN_OR_RETURN(x, std::move(inputs));
  } else {
    ASSIGN_OR_RETURN(x, Receive(MakeTag(step, a.microbatch, a.stage - 1,
                                        TensorKind::kActivation),
                                a.stage));
  }
  // Every stage computes the microbatch's documents from the data itself
  // (job/microbatch_documents.h): nothing about them crosses the network.
  if (job::StagesNeedDocuments(config_.documents)) {
    const absl::Status documents =
        job::SetStageDocuments(*stage, a.microbatch, *data_, config_.documents,
                               step, a.microbatch, m, config_.batch_size);
    spans_.Record(SpanKind::kData, a.stage, a.microbatch);
    RETURN_IF_ERROR(documents);
  }
  absl::StatusOr<Tensor> forward = stage->Forward(a.microbatch, x);
  spans_.Record(SpanKind::kForward, a.stage, a.microbatch);
  ASSIGN_OR_RETURN(Tensor y, std::move(forward));
  if (a.stage + 1 < config_.num_stages) {
    return SendTo(RankOf(a.stage + 1),
                  MakeTag(step, a.microbatch, a.stage, TensorKind::kActivation),
                  y);
  }
  // Last stage: the loss and its gradient, scaled by 1/M so the step's
  // gradient is that of the mean loss over the batch.
  absl::StatusOr<Tensor> targets =
      data_->Targets(backend_, step, a.microbatch, m, config_.batch_size);
  spans_.Record(SpanKind::kData, a.stage, a.microbatch);
  ASSIGN_OR_RETURN(Tensor target, std::move(targets));
  absl::StatusOr<engine::LossResult> computed =
      engine::ComputeLoss(backend_, config_.loss, y, target, 1.0f / m);
  spans_.Record(SpanKind::kLoss, a.stage, a.microbatch);
  ASSIGN_OR_RETURN(engine::LossResult loss, std::move(computed));
  loss_sum_ += loss.loss;
  loss_grads_[a.microbatch] = loss.grad;
  return absl::OkStatus();
}

absl::Status StageExecutor::EvaluateForward(int64_t steps_done, const Action& a,
                                            engine::DataSource* data,
                                            std::vector<float>& losses) {
  engine::PipelineStage* stage = stages_.at(a.stage);
  const int m = config_.microbatches;
  const engine::EvalBatch batch = engine::EvalBatchOf(a.microbatch, m);
  Tensor x;
  if (a.stage == 0) {
    ASSIGN_OR_RETURN(x, data->Inputs(backend_, batch.step, batch.microbatch, m,
                                     config_.batch_size));
  } else {
    ASSIGN_OR_RETURN(
        x, channel_->Recv(MakeTag(steps_done, a.microbatch, a.stage - 1,
                                  TensorKind::kEvalActivation),
                          config_.recv_timeout));
  }
  RETURN_IF_ERROR(job::SetStageDocuments(
      *stage, a.microbatch, *data, config_.eval_documents, batch.step,
      batch.microbatch, m, config_.batch_size));
  ASSIGN_OR_RETURN(Tensor y, stage->Evaluate(a.microbatch, x));
  if (a.stage + 1 < config_.num_stages) {
    return channel_->Send(
        RankOf(a.stage + 1),
        MakeTag(steps_done, a.microbatch, a.stage, TensorKind::kEvalActivation),
        y);
  }
  ASSIGN_OR_RETURN(Tensor target,
                   data->Targets(backend_, batch.step, batch.microbatch, m,
                                 config_.batch_size));
  // The training loss; its gradient is computed and dropped.
  ASSIGN_OR_RETURN(engine::LossResult loss,
                   engine::ComputeLoss(backend_, config_.loss, y, target, 1));
  losses[a.microbatch] = loss.loss;
  return absl::OkStatus();
}

absl::StatusOr<RankEvalResult> StageExecutor::RunEvaluation(
    int64_t steps_done, const std::vector<Action>& actions,
    engine::DataSource* data, int64_t batches) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t count = batches * config_.microbatches;
  const bool last = stages_.count(config_.num_stages - 1) > 0;
  std::vector<float> losses(last ? count : 0);
  int64_t summed = 0;
  for (const Action& a : actions) {
    if (a.op != Op::kForward || !stages_.count(a.stage) || a.microbatch < 0 ||
        a.microbatch >= count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", config_.rank, ", evaluation after step ", steps_done, ": ",
          scheduler::ToString(a), " is not a forward of a stage here over ",
          count, " microbatches"));
    }
    if (absl::Status s = EvaluateForward(steps_done, a, data, losses);
        !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("rank ", config_.rank,
                                 ", evaluation after step ", steps_done, ", ",
                                 scheduler::ToString(a), ": ", s.message()));
    }
    if (a.stage == config_.num_stages - 1) ++summed;
  }
  if (last && summed != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", config_.rank, ": the evaluation's actions reach the loss ",
        summed, " times for ", count, " microbatches"));
  }
  RETURN_IF_ERROR(backend_->Synchronize());
  RankEvalResult result;
  result.has_loss = last;
  if (last) result.eval = engine::SummarizeEvaluation(config_.loss, losses);
  result.eval.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  result.eval.samples = batches * config_.batch_size;
  return result;
}

absl::Status StageExecutor::BackwardInput(int64_t step, const Action& a) {
  engine::PipelineStage* stage = stages_.at(a.stage);
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
                                         TensorKind::kGradient),
                                 a.stage));
  }
  ZeroGradsOnce();
  absl::StatusOr<Tensor> backward = stage->BackwardInput(a.microbatch, dy);
  if (a.op == Op::kBackward && backward.ok()) {
    // B is BI then BW on the same microbatch: one span, as scheduled.
    absl::Status weight = stage->BackwardWeight(a.microbatch);
    if (!weight.ok()) backward = weight;
  }
  spans_.Record(KindOf(a.op), a.stage, a.microbatch);
  ASSIGN_OR_RETURN(Tensor dx, std::move(backward));
  if (a.stage == 0) return absl::OkStatus();
  return SendTo(RankOf(a.stage - 1),
                MakeTag(step, a.microbatch, a.stage, TensorKind::kGradient),
                dx);
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
  spans_.StartStep();
  const auto step_start =
      spans_.enabled() ? spans_.step_start() : SpanRecorder::Clock::now();
  loss_sum_ = 0;
  loss_grads_.clear();
  grads_zeroed_ = false;
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
      case Op::kBackwardInput:
        s = BackwardInput(step, a);
        break;
      case Op::kBackwardWeight: {
        ZeroGradsOnce();
        s = stages_.at(a.stage)->BackwardWeight(a.microbatch);
        spans_.Record(SpanKind::kBackwardWeight, a.stage, a.microbatch);
        break;
      }
    }
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("rank ", config_.rank, ", step ", step, ", ",
                                 scheduler::ToString(a), ": ", s.message()));
    }
    int held = 0;
    for (const auto& [index, stage] : stages_) held += stage->in_flight();
    result.peak_in_flight = std::max(result.peak_in_flight, held);
  }
  for (auto& [index, stage] : stages_) {
    if (stage->in_flight() != 0) {
      return absl::InternalError(absl::StrCat(
          "rank ", config_.rank, ": stage ", index, " still holds ",
          stage->in_flight(), " microbatches after the step's actions"));
    }
    result.peak_activation_bytes += stage->peak_activation_bytes();
  }
  ZeroGradsOnce();  // A rank without backwards adds no gradient.
  // A mesh stage's gradients are complete only once its replicas' are
  // summed, before the norm and the update read them. Its time counts as the
  // optimizer's, in the span of the work that follows (no span of its own,
  // so a single-device step's timeline is unchanged).
  for (auto& [index, stage] : stages_) {
    RETURN_IF_ERROR(stage->BeforeOptimizerStep());
  }
  RETURN_IF_ERROR(SumTiedGradients(step));
  // Every step reports its share of the gradient norm (the coordinator
  // sums the ranks'); clipping needs the whole norm before the update, so
  // it sums them here too. Without the all-reduce this rank's is the whole
  // (the optimizer would compute the same sum again).
  ASSIGN_OR_RETURN(const double local, optimizer_->GradSquaredSum());
  result.grad_squared_sum = local;
  std::optional<double> global_norm = std::sqrt(local);
  if (all_reduce) {
    spans_.Record(SpanKind::kOptimizer);
    absl::StatusOr<double> total = all_reduce(local);
    spans_.Record(SpanKind::kAllReduce);
    RETURN_IF_ERROR(total.status());
    global_norm = std::sqrt(*total);
  }
  absl::StatusOr<double> norm = optimizer_->Step(global_norm);
  absl::Status synced = backend_->Synchronize();
  // Replicas of a mesh stage take the updated parameters, within the
  // update's span.
  absl::Status replicated = absl::OkStatus();
  for (auto& [index, stage] : stages_) {
    if (!norm.ok() || !synced.ok() || !replicated.ok()) break;
    replicated = stage->AfterOptimizerStep();
  }
  const auto end = spans_.Record(SpanKind::kOptimizer);
  ASSIGN_OR_RETURN(result.grad_norm, std::move(norm));
  RETURN_IF_ERROR(synced);
  RETURN_IF_ERROR(replicated);
  if (config_.check_tied) RETURN_IF_ERROR(CheckTiedCopies(step));
  result.has_loss = stages_.count(config_.num_stages - 1) > 0;
  result.loss = loss_sum_ / config_.microbatches;
  result.seconds =
      std::chrono::duration<double>(
          (spans_.enabled() ? end : SpanRecorder::Clock::now()) - step_start)
          .count();
  SummarizeSpans(result);
  return result;
}

absl::Status StageExecutor::ForEachTiedHere(const TiedVisitor& visit) {
  for (int i = 0; i < static_cast<int>(config_.tied.size()); ++i) {
    const engine::TiedParameter& tie = config_.tied[i];
    engine::Parameter* sides[2] = {nullptr, nullptr};  // Original, copy.
    for (int copy = 0; copy < 2; ++copy) {
      const int stage = copy ? tie.copy_stage : tie.original_stage;
      auto it = stages_.find(stage);
      if (it == stages_.end()) continue;
      sides[copy] = engine::FindParameter(*it->second, tie.name, copy == 1);
      if (sides[copy] == nullptr) {
        return absl::InternalError(
            absl::StrCat("rank ", config_.rank, ": stage ", stage,
                         " does not hold the tied ", copy ? "copy" : "original",
                         " of ", tie.name));
      }
    }
    if (sides[0] == nullptr && sides[1] == nullptr) continue;
    RETURN_IF_ERROR(visit(i, tie, sides[0], sides[1]));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::SumTiedGradients(int64_t step) {
  if (config_.tied.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(ForEachTiedHere([&](int i, const engine::TiedParameter& tie,
                                      engine::Parameter* original,
                                      engine::Parameter* copy) -> absl::Status {
    if (original != nullptr && copy != nullptr) {
      backend_->Add(original->grad, copy->grad, original->grad);
      backend_->Copy(original->grad, copy->grad);
      return absl::OkStatus();
    }
    engine::Parameter* mine = original != nullptr ? original : copy;
    const int peer =
        RankOf(original != nullptr ? tie.copy_stage : tie.original_stage);
    // A snapshot goes out: the channel may read the tensor after Send
    // returns, and the sum below overwrites the gradient.
    ASSIGN_OR_RETURN(Tensor sent,
                     backend_->Empty(mine->grad.shape(), engine::DType::kF32));
    backend_->Copy(mine->grad, sent);
    RETURN_IF_ERROR(
        channel_->Send(peer, TiedTag(step, 1 + i, config_.rank), sent));
    ASSIGN_OR_RETURN(Tensor theirs, channel_->Recv(TiedTag(step, 1 + i, peer),
                                                   config_.recv_timeout));
    if (theirs.dtype() != engine::DType::kF32 ||
        theirs.shape() != mine->grad.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the gradient of tied parameter ", tie.name, " from rank ", peer,
          " is ", engine::DTypeName(theirs.dtype()),
          engine::ShapeString(theirs.shape()), ", expected F32",
          engine::ShapeString(mine->grad.shape())));
    }
    backend_->Add(original != nullptr ? mine->grad : theirs,
                  original != nullptr ? theirs : mine->grad, mine->grad);
    return absl::OkStatus();
  }));
  spans_.Record(SpanKind::kAllReduce);
  return absl::OkStatus();
}

absl::Status StageExecutor::CheckTiedCopies(int64_t step) {
  const int n = static_cast<int>(config_.tied.size());
  auto checksum = [&](const engine::Parameter& p) -> absl::StatusOr<double> {
    std::vector<uint8_t> host(p.value.bytes());
    RETURN_IF_ERROR(backend_->CopyToHost(p.value, host.data(), host.size()));
    return static_cast<double>(Crc32c(host));
  };
  return ForEachTiedHere([&](int i, const engine::TiedParameter& tie,
                             engine::Parameter* original,
                             engine::Parameter* copy) -> absl::Status {
    // A CRC32C is exact in a double, which the channel carries as F64[1].
    double want = 0, got = 0;
    if (original != nullptr) {
      ASSIGN_OR_RETURN(want, checksum(*original));
    }
    if (copy != nullptr) {
      ASSIGN_OR_RETURN(got, checksum(*copy));
    }
    const transport::Tag tag =
        TiedTag(step, 1 + n + i, RankOf(tie.original_stage));
    if (copy == nullptr) {
      ASSIGN_OR_RETURN(Tensor t, backend_->Empty({1}, engine::DType::kF64));
      RETURN_IF_ERROR(backend_->CopyFromHost(&want, sizeof(want), t));
      return channel_->Send(RankOf(tie.copy_stage), tag, t);
    }
    if (original == nullptr) {
      ASSIGN_OR_RETURN(Tensor t, channel_->Recv(tag, config_.recv_timeout));
      if (t.dtype() != engine::DType::kF64 || t.numel() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the checksum of tied parameter ", tie.name, " is not an F64[1]"));
      }
      RETURN_IF_ERROR(backend_->CopyToHost(t, &want, sizeof(want)));
    }
    if (want != got) {
      return absl::InternalError(absl::StrCat(
          "tied parameter ", tie.name, ": after step ", step + 1,
          " the copy on stage ", tie.copy_stage,
          " differs from the original on stage ", tie.original_stage,
          " (CRC32C ", static_cast<uint32_t>(got), " vs ",
          static_cast<uint32_t>(want),
          "); both should have taken the same update"));
    }
    return absl::OkStatus();
  });
}

void StageExecutor::SummarizeSpans(RankStepResult& result) const {
  result.start_unix_us = spans_.step_start_unix_us();
  result.spans = spans_.spans();
  int64_t total_params = 0;
  for (const auto& [index, stage] : stages_) {
    StageStepTimes& t = result.stages[index];
    t.peak_activation_bytes = stage->peak_activation_bytes();
    total_params += stage_params_.at(index);
  }
  result.wait_seconds = 0;
  for (const telemetry::Span& span : result.spans) {
    const double seconds = static_cast<double>(span.duration_us) * 1e-6;
    if (span.kind == SpanKind::kRecvWait) result.wait_seconds += seconds;
    if (span.stage < 0) {
      // Rank-wide work, split over the rank's stages by parameter count
      // (evenly when there are none).
      for (auto& [index, t] : result.stages) {
        const double share =
            total_params > 0 ? static_cast<double>(stage_params_.at(index)) /
                                   static_cast<double>(total_params)
                             : 1.0 / static_cast<double>(result.stages.size());
        (span.kind == SpanKind::kOptimizer ? t.optimizer_seconds
                                           : t.communication_seconds) +=
            seconds * share;
      }
      continue;
    }
    auto it = result.stages.find(span.stage);
    if (it == result.stages.end()) continue;  // A send of another stage: none.
    StageStepTimes& t = it->second;
    switch (span.kind) {
      case SpanKind::kForward:
        ++t.microbatches;
        t.forward_seconds += seconds;
        break;
      case SpanKind::kData:
        t.data_seconds += seconds;
        t.forward_seconds += seconds;
        break;
      case SpanKind::kLoss:
        t.forward_seconds += seconds;
        break;
      case SpanKind::kBackward:
      case SpanKind::kBackwardInput:
      case SpanKind::kBackwardWeight:
        t.backward_seconds += seconds;
        break;
      case SpanKind::kSend:
      case SpanKind::kAllReduce:
        t.communication_seconds += seconds;
        break;
      case SpanKind::kRecvWait:
        t.idle_seconds += seconds;
        break;
      case SpanKind::kOptimizer:
        t.optimizer_seconds += seconds;
        break;
    }
  }
}

}  // namespace conveyor::worker
