#include "engine/backend.h"

#include <string>

#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"

namespace conveyor::engine {

absl::StatusOr<Tensor> Backend::EmptyHostStaging(const Shape& shape,
                                                 DType dtype) {
  return CpuBackend::Get()->Empty(shape, dtype);
}

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

namespace {

// `batch` row-major matrices `stride` apart, each `rows` rows `ld` apart of
// `cols` columns.
int64_t Extent(int64_t batch, int64_t stride, int64_t rows, int64_t cols,
               int64_t ld) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

}  // namespace

int64_t GemmExtentA(const GemmBatch& g) {
  return Extent(g.batch, g.stride_a, g.trans_a ? g.k : g.m,
                g.trans_a ? g.m : g.k, g.lda);
}

int64_t GemmExtentB(const GemmBatch& g) {
  return Extent(g.batch, g.stride_b, g.trans_b ? g.n : g.k,
                g.trans_b ? g.k : g.n, g.ldb);
}

}  // namespace conveyor::engine
