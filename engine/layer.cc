#include "engine/layer.h"

#include "common/status_macros.h"

namespace conveyor::engine {

size_t Stash::bytes() const {
  size_t total = 0;
  for (const Tensor& t : saved) total += t.defined() ? t.bytes() : 0;
  for (const Tensor& t : output_grads) total += t.defined() ? t.bytes() : 0;
  for (const Stash& child : children) total += child.bytes();
  return total;
}

absl::Status AddGemmCopies(const std::vector<Parameter*>& params) {
  for (Parameter* p : params) {
    Backend* backend = p->value.backend();
    // Matrices only: vectors (norms, biases) never enter a GEMM.
    if (backend == nullptr || !backend->bf16_gemms() || !p->gemm_operand ||
        p->value.rank() < 2 || p->value.dtype() != DType::kF32 ||
        p->value_bf16.defined()) {
      continue;
    }
    ASSIGN_OR_RETURN(p->value_bf16,
                     backend->Empty(p->value.shape(), DType::kBF16));
    backend->CastToBf16(p->value, p->value_bf16);
  }
  return absl::OkStatus();
}

void RefreshGemmCopies(const std::vector<Parameter*>& params) {
  for (Parameter* p : params) {
    if (p->value_bf16.defined()) {
      p->value.backend()->CastToBf16(p->value, p->value_bf16);
    }
  }
}

}  // namespace conveyor::engine
