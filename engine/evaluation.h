// Evaluation: what one evaluation pass (the job's `eval:` section,
// job/job_spec.h EvalSpec) computes, in one place, so the pipelined
// executor (worker/stage_executor.h RunEvaluation) and the in-process
// reference (job/trainer.h) arrive at the bitwise-same figure.
//
// An evaluation runs K * M microbatches: microbatch i is microbatch i mod M
// of the validation data's step i / M (EvalBatchOf). Each gives its mean
// loss as ComputeLoss does in training; the evaluation's loss is their sum,
// in index order and in double, over K * M: the mean over the K * M *
// microbatch_size samples, since microbatches are equal in size.
// Pure functions; thread-safe.
#ifndef CONVEYOR_ENGINE_EVALUATION_H_
#define CONVEYOR_ENGINE_EVALUATION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/loss_kind.h"

namespace conveyor::engine {

struct EvalResult {
  double loss = 0;
  // exp(loss) for cross-entropy; unset for mse, where it means nothing.
  std::optional<double> perplexity;
  double seconds = 0;   // Wall time of the pass (the rank's, pipelined).
  int64_t samples = 0;  // K * batch_size.
};

// The validation data's step and microbatch of evaluation microbatch `i`
// with M = `microbatches`.
struct EvalBatch {
  int64_t step = 0;
  int microbatch = 0;
};
inline EvalBatch EvalBatchOf(int64_t i, int microbatches) {
  return {.step = i / microbatches,
          .microbatch = static_cast<int>(i % microbatches)};
}

// The evaluation's loss and perplexity from its microbatches' mean losses,
// by index (see the file comment); seconds and samples are left 0.
EvalResult SummarizeEvaluation(LossKind kind,
                               const std::vector<float>& microbatch_losses);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_EVALUATION_H_
