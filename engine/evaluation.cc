#include "engine/evaluation.h"

#include <cmath>

namespace conveyor::engine {

EvalResult SummarizeEvaluation(LossKind kind,
                               const std::vector<float>& microbatch_losses) {
  EvalResult r;
  double sum = 0;
  for (float loss : microbatch_losses) sum += loss;
  if (!microbatch_losses.empty()) {
    r.loss = sum / static_cast<double>(microbatch_losses.size());
  }
  if (kind == LossKind::kCrossEntropy) r.perplexity = std::exp(r.loss);
  return r;
}

}  // namespace conveyor::engine
