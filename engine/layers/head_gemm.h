// One strided batch of GEMMs over equal, contiguous slices of row-major
// tensors: what attention runs per (batch, head) or, for grouped-query
// attention, per (batch, key/value group). Each tensor is cut into `batch`
// slices of numel / batch elements; `a_cols`, `b_cols` are the row lengths
// of A's and B's slices as stored (before any transpose), C's is its last
// dimension.
#ifndef CONVEYOR_ENGINE_LAYERS_HEAD_GEMM_H_
#define CONVEYOR_ENGINE_LAYERS_HEAD_GEMM_H_

#include <cstdint>

#include "engine/backend.h"
#include "engine/tensor.h"

namespace conveyor::engine {

inline GemmBatch HeadGemm(int64_t batch, bool trans_a, bool trans_b, int64_t m,
                          int64_t n, int64_t k, const Tensor& a, int64_t a_cols,
                          const Tensor& b, int64_t b_cols, float beta,
                          const Tensor& c) {
  GemmBatch g;
  g.batch = batch;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.beta = beta;
  g.a = a.data<float>();
  g.lda = a_cols;
  g.stride_a = a.numel() / batch;
  g.b = b.data<float>();
  g.ldb = b_cols;
  g.stride_b = b.numel() / batch;
  g.c = c.data<float>();
  g.ldc = c.dim(-1);
  g.stride_c = c.numel() / batch;
  return g;
}

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_HEAD_GEMM_H_
