#include "job/trainer.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "engine/boundary_precision.h"
#include "engine/loss.h"
#include "job/microbatch_documents.h"
#include "job/model_init.h"

namespace conveyor::job {

using engine::Backend;
using engine::DataSource;
using engine::DType;
using engine::EvalBatch;
using engine::EvalBatchOf;
using engine::EvalResult;
using engine::LossResult;
using engine::ModelSpec;
using engine::Optimizer;
using engine::Parameter;
using engine::PipelineStage;
using engine::Stage;
using engine::Tensor;
using engine::TensorToWrite;
using engine::TiedParameter;
using engine::WriteSafetensors;

absl::StatusOr<std::unique_ptr<InProcessTrainer>> InProcessTrainer::Create(
    Backend* backend, const JobSpec& job) {
  std::unique_ptr<InProcessTrainer> t(new InProcessTrainer(backend, job));
  const ModelSpec& model = t->job_.model;
  for (int s = 0; s < model.num_stages; ++s) {
    ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage,
                     Stage::Create(backend, model, s));
    t->stages_.push_back(std::move(stage));
  }
  std::vector<PipelineStage*> stages;
  for (auto& stage : t->stages_) stages.push_back(stage.get());
  RETURN_IF_ERROR(InitializeStages(model, stages));
  for (const TiedParameter& tie : model.TiedParameters()) {
    Parameter* original =
        FindParameter(*t->stages_[tie.original_stage], tie.name, false);
    Parameter* copy =
        FindParameter(*t->stages_[tie.copy_stage], tie.name, true);
    CONVEYOR_CHECK(original != nullptr && copy != nullptr,
                   "a tied parameter's stages hold it");
    t->tied_.emplace_back(original, copy);
  }
  ASSIGN_OR_RETURN(t->data_,
                   DataSource::Create(t->job_.data, ModelSampleShapes(model)));
  if (t->job_.eval.enabled) {
    ASSIGN_OR_RETURN(t->eval_data_, CreateEvalDataSource(t->job_));
  }
  ResolveSchedule(t->job_.optimizer, t->job_.training.steps);
  ASSIGN_OR_RETURN(t->optimizer_, Optimizer::Create(backend, t->job_.optimizer,
                                                    t->parameters()));
  return t;
}

std::vector<Parameter*> InProcessTrainer::parameters() const {
  std::vector<Parameter*> all;
  for (const auto& stage : stages_) {
    for (Parameter* p : stage->parameters()) all.push_back(p);
  }
  return all;
}

absl::StatusOr<StepReport> InProcessTrainer::Step() {
  absl::StatusOr<StepReport> report = RunStep();
  if (!report.ok()) {
    // Leave no microbatch half done, so a later step starts clean; its
    // ZeroGrad drops the partial gradients.
    for (auto& stage : stages_) stage->DropInFlight();
  }
  return report;
}

absl::StatusOr<StepReport> InProcessTrainer::RunStep() {
  const auto start = std::chrono::steady_clock::now();
  const TrainingSpec& t = job_.training;
  const int m = static_cast<int>(t.microbatches);
  StepReport report;
  report.step = step_ + 1;
  report.learning_rate = optimizer_->current_lr();
  optimizer_->ZeroGrad();
  for (auto& stage : stages_) stage->ResetPeakActivationBytes();
  backend_->ResetPeakMemory();
  double loss_sum = 0;
  for (int mb = 0; mb < m; ++mb) {
    ASSIGN_OR_RETURN(Tensor x,
                     data_->Inputs(backend_, step_, mb, m, t.batch_size));
    // One layout per microbatch, handed to every stage (each keeps a copy).
    ASSIGN_OR_RETURN(
        const engine::MicrobatchDocuments documents,
        DocumentsFor(*data_, job_.data.documents, step_, mb, m, t.batch_size));
    for (size_t s = 0; s < stages_.size(); ++s) {
      if (!documents.empty()) {
        RETURN_IF_ERROR(stages_[s]->SetDocuments(mb, documents));
      }
      ASSIGN_OR_RETURN(x, stages_[s]->Forward(mb, x));
      // What a pipelined run's next stage receives (bf16 under bf16).
      if (s + 1 < stages_.size()) {
        ASSIGN_OR_RETURN(x, engine::ThroughBoundary(x, t.precision));
      }
    }
    ASSIGN_OR_RETURN(Tensor target,
                     data_->Targets(backend_, step_, mb, m, t.batch_size));
    ASSIGN_OR_RETURN(LossResult loss, ComputeLoss(backend_, job_.model.loss, x,
                                                  target, 1.0f / m));
    loss_sum += loss.loss;
    Tensor grad = loss.grad;
    for (size_t s = stages_.size(); s-- > 0;) {
      ASSIGN_OR_RETURN(grad, stages_[s]->Backward(mb, grad));
      // What a pipelined run's previous stage receives.
      if (s > 0) {
        ASSIGN_OR_RETURN(grad, engine::ThroughBoundary(grad, t.precision));
      }
    }
  }
  // A tied parameter's two gradients, summed into both in the order the
  // pipelined exchange sums them (worker/stage_executor.h), so both copies
  // take the same update.
  for (auto [original, copy] : tied_) {
    backend_->Add(original->grad, copy->grad, original->grad);
    backend_->Copy(original->grad, copy->grad);
  }
  ASSIGN_OR_RETURN(const double grad_squared_sum, optimizer_->GradSquaredSum());
  report.grad_norm = std::sqrt(grad_squared_sum);
  // The norm is the one clipping would compute: handing it over spares the
  // optimizer a second pass.
  RETURN_IF_ERROR(optimizer_->Step(report.grad_norm).status());
  RETURN_IF_ERROR(backend_->Synchronize());
  ++step_;
  // Microbatches are equal in size, so the mean of their means is the mean
  // over the batch.
  report.loss = loss_sum / m;
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  report.samples_per_second =
      report.seconds > 0 ? t.batch_size / report.seconds : 0;
  for (auto& stage : stages_) {
    report.peak_activation_bytes += stage->peak_activation_bytes();
  }
  report.memory = backend_->memory_stats();
  return report;
}

absl::StatusOr<EvalResult> InProcessTrainer::Evaluate() {
  if (eval_data_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_.name, " has no eval section"));
  }
  const auto start = std::chrono::steady_clock::now();
  const TrainingSpec& t = job_.training;
  const int m = static_cast<int>(t.microbatches);
  const int64_t count = job_.eval.batches * m;
  std::vector<float> losses(count);
  for (int64_t i = 0; i < count; ++i) {
    const EvalBatch b = EvalBatchOf(i, m);
    ASSIGN_OR_RETURN(
        Tensor x,
        eval_data_->Inputs(backend_, b.step, b.microbatch, m, t.batch_size));
    ASSIGN_OR_RETURN(const engine::MicrobatchDocuments documents,
                     DocumentsFor(*eval_data_, job_.eval.data.documents, b.step,
                                  b.microbatch, m, t.batch_size));
    for (auto& stage : stages_) {
      if (!documents.empty()) {
        RETURN_IF_ERROR(stage->SetDocuments(static_cast<int>(i), documents));
      }
      ASSIGN_OR_RETURN(x, stage->Evaluate(static_cast<int>(i), x));
    }
    ASSIGN_OR_RETURN(
        Tensor target,
        eval_data_->Targets(backend_, b.step, b.microbatch, m, t.batch_size));
    // The gradient is computed and dropped: the loss is the training one.
    ASSIGN_OR_RETURN(LossResult loss,
                     ComputeLoss(backend_, job_.model.loss, x, target, 1.0f));
    losses[i] = loss.loss;
  }
  RETURN_IF_ERROR(backend_->Synchronize());
  EvalResult r = SummarizeEvaluation(job_.model.loss, losses);
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  r.samples = job_.eval.batches * t.batch_size;
  return r;
}

absl::Status InProcessTrainer::Run(
    const std::function<void(const StepReport&)>& on_step) {
  while (step_ < job_.training.steps) {
    ASSIGN_OR_RETURN(StepReport report, Step());
    if (job_.eval.DueAfter(step_, job_.training.steps)) {
      ASSIGN_OR_RETURN(report.eval, Evaluate());
    }
    on_step(report);
  }
  return absl::OkStatus();
}

absl::Status InProcessTrainer::SaveParameters(const std::string& path) const {
  return job::SaveParameters(backend_, parameters(), path,
                             {{"format", "pt"},
                              {"producer", "conveyor"},
                              {"job", job_.name},
                              {"step", absl::StrCat(step_)}});
}

absl::Status SaveParameters(
    Backend* backend, const std::vector<Parameter*>& params,
    const std::string& path,
    const std::map<std::string, std::string>& metadata) {
  std::vector<std::vector<float>> host(params.size());
  std::vector<TensorToWrite> tensors;
  RETURN_IF_ERROR(backend->Synchronize());
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]->tied_copy) continue;  // Held once, as its original.
    const Tensor& v = params[i]->value;
    host[i].resize(v.numel());
    RETURN_IF_ERROR(backend->CopyToHost(v, host[i].data(), v.bytes()));
    tensors.push_back({.name = params[i]->name,
                       .dtype = DType::kF32,
                       .shape = v.shape(),
                       .data = host[i].data(),
                       .bytes = v.bytes()});
  }
  return WriteSafetensors(path, tensors, metadata);
}

}  // namespace conveyor::job
