#include "engine/boundary_precision.h"

#include "common/status_macros.h"
#include "engine/backend.h"

namespace conveyor::engine {

absl::StatusOr<Tensor> ToBoundary(const Tensor& t, Precision precision) {
  if (precision != Precision::kBf16 || !t.defined() ||
      t.dtype() != DType::kF32) {
    return t;
  }
  Backend* backend = t.backend();
  ASSIGN_OR_RETURN(Tensor out, backend->Empty(t.shape(), DType::kBF16));
  backend->CastToBf16(t, out);
  return out;
}

absl::StatusOr<Tensor> FromBoundary(const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::kBF16) return t;
  Backend* backend = t.backend();
  ASSIGN_OR_RETURN(Tensor out, backend->Empty(t.shape(), DType::kF32));
  backend->CastFromBf16(t, out);
  return out;
}

absl::StatusOr<Tensor> ThroughBoundary(const Tensor& t, Precision precision) {
  ASSIGN_OR_RETURN(Tensor sent, ToBoundary(t, precision));
  return FromBoundary(sent);
}

}  // namespace conveyor::engine
