#include "engine/backend.h"

#include <string>

#include "common/status_macros.h"

namespace conveyor::engine {

absl::StatusOr<Tensor> Backend::Zeros(const Shape& shape, DType dtype) {
  ASSIGN_OR_RETURN(Tensor t, Empty(shape, dtype));
  if (t.bytes() > 0) {
    if (dtype == DType::kF32) {
      Fill(t, 0.0f);
    } else {
      // Only f32 has a fill kernel; other dtypes are zeroed through a host
      // copy, which is rare (token ids come from data, not from zeros).
      std::string zeros(t.bytes(), '\0');
      RETURN_IF_ERROR(CopyFromHost(zeros.data(), zeros.size(), t));
    }
  }
  return t;
}

}  // namespace conveyor::engine
