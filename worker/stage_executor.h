// StageExecutor: runs one rank's part of a training step: its action list
// from the schedule (F, B, BI, BW of the stages it holds), moving tensors
// through a Channel, then one optimizer step.
//
// For each action:
//   F(s, mb):  the input comes from the data (s = 0) or from stage s-1 over
//              the channel; the output goes to stage s+1, or, on the last
//              stage, into the loss (forward, loss and loss gradient fused),
//              each microbatch's gradient scaled by 1/M.
//   B / BI(s, mb): the output gradient comes from stage s+1 (or the loss);
//              the input gradient goes to stage s-1 (not from stage 0).
//   BW(s, mb): the weight gradient, from what BI kept.
// After the actions every microbatch must be through BW. Gradients were
// accumulated over the step (a mesh stage sums its replicas' into
// parameters() first: PipelineStage::BeforeOptimizerStep); clipping uses the
// norm over all ranks, obtained through the caller's reduction, so a pipelined
// step equals the in-process reference step.
//
// A tied parameter (engine::TiedParameter: a tied lm_head's copy of the
// embedding) is held by two stages, usually on two ranks. Before the norm
// and the update, each of the two ranks sends its gradient to the other and
// both compute original + copy, in that order, so both hold the bitwise-same
// sum and take the same update; with both stages on one rank the sum is
// local. With check_tied, after the update the original's rank sends a
// checksum of its values and the copy's rank fails the step if its own
// differs.
//
// RunEvaluation runs an evaluation between steps (engine/evaluation.h): a
// forward-only schedule's actions (scheduler/forward_only.h) over the
// validation data, each stage's Evaluate keeping nothing, activations
// travelling under their own tag kind (transport::TensorKind::
// kEvalActivation); the last stage sums the losses exactly as
// InProcessTrainer::Evaluate does, so the two are bitwise equal.
//
// Thread-compatible: one thread runs a rank's executor.
#ifndef CONVEYOR_WORKER_STAGE_EXECUTOR_H_
#define CONVEYOR_WORKER_STAGE_EXECUTOR_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data.h"
#include "engine/evaluation.h"
#include "engine/loss_kind.h"
#include "engine/model_spec.h"
#include "engine/optimizer.h"
#include "engine/pipeline_stage.h"
#include "engine/precision.h"
#include "scheduler/action.h"
#include "scheduler/placement.h"
#include "telemetry/span_recorder.h"
#include "transport/channel.h"

namespace conveyor::worker {

#ifdef NDEBUG
inline constexpr bool kDebugBuild = false;
#else
inline constexpr bool kDebugBuild = true;
#endif

struct ExecutorConfig {
  uint64_t job = 0;
  int rank = 0;
  int num_ranks = 1;  // P
  // Which rank runs each stage: the schedule's (scheduler/placement.h).
  scheduler::Placement placement = scheduler::Placement::kLoop;
  int num_stages = 1;  // P * V
  int64_t batch_size = 1;
  int microbatches = 1;
  engine::LossKind loss = engine::LossKind::kMse;
  // training.precision: under bf16 the activations and gradients sent to
  // other stages travel as bf16 (engine/boundary_precision.h).
  engine::Precision precision = engine::Precision::kFp32;
  // data.documents and eval.data.documents: what each stage is told of the
  // documents packed into its microbatches (job/microbatch_documents.h).
  engine::DocumentsConfig documents = {};
  engine::DocumentsConfig eval_documents = {};
  std::chrono::milliseconds recv_timeout{30000};
  // Record the step's timeline (RankStepResult::spans and the per-stage
  // times derived from it). Off only to measure what recording costs: the
  // wait and per-stage times are then zero.
  bool record_spans = true;
  // The model's tied parameters (engine::ModelSpec::TiedParameters()), in
  // the same order on every rank.
  std::vector<engine::TiedParameter> tied = {};
  // Check after every update that each tied parameter's copies are bitwise
  // equal (see the file comment): a copy of the values to the host and a
  // checksum each step, so on by default only in debug builds.
  bool check_tied = kDebugBuild;
};

// Where one stage's share of a step went (from the step's spans). The
// rank-wide optimizer and gradient-norm reduction are split over the rank's
// stages by parameter count.
struct StageStepTimes {
  double forward_seconds = 0;  // Forward, its data reads and the loss.
  // Of forward_seconds: waiting for the data loader (inputs, targets and
  // the microbatch's documents).
  double data_seconds = 0;
  double backward_seconds = 0;  // B, BI and BW.
  double optimizer_seconds = 0;
  double communication_seconds = 0;  // Sends and the norm reduction.
  double idle_seconds = 0;           // Waiting for tensors.
  int64_t microbatches = 0;          // Forwards run.
  size_t peak_activation_bytes = 0;
};

struct RankStepResult {
  bool has_loss = false;  // Only the rank holding the last stage.
  double loss = 0;        // Mean over the global batch.
  double seconds = 0;
  double wait_seconds = 0;  // Blocked in Recv: this rank's bubble.
  double grad_norm = 0;     // When clipping.
  // This rank's sum of squared gradients before clipping (tied copies
  // once); the job's gradient norm is the root of the ranks' sum.
  double grad_squared_sum = 0;
  size_t peak_activation_bytes = 0;
  // The most (stage, microbatch) pairs this rank held at once: forwarded
  // and not yet through BW, over its stages. Depends on the action order
  // only, so it equals the simulator's SimulationResult::peak_inflight for
  // the rank under any costs.
  int peak_in_flight = 0;
  // The step's timeline: every action, send, receive wait and the
  // optimizer, microseconds from start_unix_us (wall clock).
  int64_t start_unix_us = 0;
  std::vector<telemetry::Span> spans;
  std::map<int, StageStepTimes> stages;  // By global stage index.
  // The step's peaks on the rank's fullest device (set by the JobRunner,
  // which knows the devices); zeros when not counted.
  engine::MemoryStats memory;
};

struct RankEvalResult {
  bool has_loss = false;  // Only the rank holding the last stage.
  // loss and perplexity with has_loss; seconds and samples always.
  engine::EvalResult eval;
};

// Sums a value over all ranks of the job and returns the total to each
// (for the global gradient norm).
using AllReduceSum = std::function<absl::StatusOr<double>(double)>;

class StageExecutor {
 public:
  // `stages` maps global stage index to the rank's stage (one device's
  // engine::Stage or a mesh's engine::MeshStage); all must satisfy
  // s mod P == rank. The data source, optimizer (over exactly these stages'
  // parameters) and channel outlive the executor.
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(
      const ExecutorConfig& config,
      std::map<int, engine::PipelineStage*> stages, engine::DataSource* data,
      engine::Optimizer* optimizer, transport::Channel* channel,
      engine::Backend* backend);

  // Runs `actions` for step `step` and the optimizer step. `all_reduce` is
  // needed only when the optimizer clips gradients. On any error the step is
  // abandoned; the caller aborts the job.
  absl::StatusOr<RankStepResult> RunStep(
      int64_t step, const std::vector<scheduler::Action>& actions,
      const AllReduceSum& all_reduce = nullptr);

  // Runs this rank's forward-only `actions` of the evaluation after
  // `steps_done` completed steps: `batches` batches of `data` (the
  // validation data, outliving the call), K * M microbatches. Leaves the
  // parameters, gradients and in-flight state as they were. InvalidArgument
  // for an action that is not a forward of a stage here or names a
  // microbatch outside [0, K * M); the data's, a stage's or the channel's
  // errors as they come, prefixed with the rank and action.
  absl::StatusOr<RankEvalResult> RunEvaluation(
      int64_t steps_done, const std::vector<scheduler::Action>& actions,
      engine::DataSource* data, int64_t batches);

 private:
  StageExecutor(const ExecutorConfig& config,
                std::map<int, engine::PipelineStage*> stages,
                engine::DataSource* data, engine::Optimizer* optimizer,
                transport::Channel* channel, engine::Backend* backend)
      : config_(config),
        stages_(std::move(stages)),
        data_(data),
        optimizer_(optimizer),
        channel_(channel),
        backend_(backend),
        spans_(config.record_spans) {}

  int RankOf(int stage) const {
    return scheduler::StageRank(config_.placement, stage, config_.num_ranks);
  }
  absl::StatusOr<RankStepResult> RunActions(
      int64_t step, const std::vector<scheduler::Action>& actions,
      const AllReduceSum& all_reduce);
  absl::Status Forward(int64_t step, const scheduler::Action& a);
  // One forward of RunEvaluation; the last stage's loss into `losses`.
  absl::Status EvaluateForward(int64_t steps_done, const scheduler::Action& a,
                               engine::DataSource* data,
                               std::vector<float>& losses);
  absl::Status BackwardInput(int64_t step, const scheduler::Action& a);
  absl::StatusOr<engine::Tensor> Receive(const transport::Tag& tag,
                                         int for_stage);
  absl::Status SendTo(int to, const transport::Tag& tag,
                      const engine::Tensor& tensor);
  // Zeroes the gradients the first time in a step that it is called: before
  // the step's first receive or backward, whichever comes first, and
  // before the optimizer. Not at the start of the step, because the first
  // rank's first actions are forwards that the next rank waits for, while
  // before its first receive it would only wait (zeroing took a third of a
  // millisecond of the GPT example's 50 ms step; see docs/performance.md).
  void ZeroGradsOnce();
  // Calls `visit(i, tie, original, copy)` for each tied parameter this rank
  // holds a side of (nullptr for a side on another rank), stopping at the
  // first error; Internal when a stage here lacks its side.
  using TiedVisitor = std::function<absl::Status(
      int i, const engine::TiedParameter& tie, engine::Parameter* original,
      engine::Parameter* copy)>;
  absl::Status ForEachTiedHere(const TiedVisitor& visit);
  // Sums each tied parameter's two gradients (see the file comment).
  absl::Status SumTiedGradients(int64_t step);
  // check_tied: fails if a copy differs from its original.
  absl::Status CheckTiedCopies(int64_t step);
  void SummarizeSpans(RankStepResult& result) const;
  transport::Tag MakeTag(int64_t step, int mb, int stage,
                         transport::TensorKind kind) const;
  // The tag of a tied parameter's exchange: a kPartialSum of `sender` in
  // `slot` (transport/channel.h).
  transport::Tag TiedTag(int64_t step, int slot, int sender) const;

  ExecutorConfig config_;
  std::map<int, engine::PipelineStage*> stages_;
  engine::DataSource* data_;
  engine::Optimizer* optimizer_;
  transport::Channel* channel_;
  engine::Backend* backend_;

  // Parameters per stage, for splitting rank-wide time over stages.
  std::map<int, int64_t> stage_params_;

  // Per step: loss gradients of the last stage awaiting their backward, the
  // summed loss and the timeline.
  std::map<int, engine::Tensor> loss_grads_;
  double loss_sum_ = 0;
  // Whether this step has zeroed the gradients yet (ZeroGradsOnce).
  bool grads_zeroed_ = false;
  telemetry::SpanRecorder spans_;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_STAGE_EXECUTOR_H_
