// The CUDA backend's GEMMs: row-major operands mapped onto column-major
// cuBLAS by swapping them, fp32 or TF32 compute, or bf16-rounded inputs with
// fp32 accumulation (engine/precision.h).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "common/check.h"
#include "engine/cuda/cublas_util.h"  // defines: CONVEYOR_CUBLAS_CHECK
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/internal/cuda_backend_impl.h"  // defines: Scratch
#include "engine/cuda/internal/kernels.h"  // defines: ScaleMatrices, ToBf16

namespace conveyor::engine {

namespace ci = cuda_internal;

namespace {

int AsInt(int64_t v, const char* what) {
  CONVEYOR_CHECK(v >= 0 && v <= INT_MAX, what);
  return static_cast<int>(v);
}

}  // namespace

void CudaBackend::GemmStridedBatched(const GemmBatch& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  Activate();
  if (g.k == 0) {
    // BLAS semantics (C = beta C, and beta == 0 ignores C); cuBLAS may
    // return early without touching C.
    ci::ScaleMatrices(g.batch, g.m, g.n, g.beta, g.c, g.ldc, g.stride_c,
                      stream());
    return;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // same memory, with the operands swapped and m and n exchanged.
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = AsInt(g.m, "gemm m exceeds int"),
            n = AsInt(g.n, "gemm n exceeds int"),
            k = AsInt(g.k, "gemm k exceeds int");
  const int lda = AsInt(g.lda, "gemm lda exceeds int"),
            ldb = AsInt(g.ldb, "gemm ldb exceeds int"),
            ldc = AsInt(g.ldc, "gemm ldc exceeds int");
  const cublasComputeType_t compute =
      options_.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (options_.precision == Precision::kBf16) {
    GemmBf16(g, op_a, op_b, m, n, k, lda, ldb, ldc);
    return;
  }
  // bf16 copies exist only on bf16 backends (Parameter::value_bf16).
  CONVEYOR_CHECK(g.a_bf16 == nullptr && g.b_bf16 == nullptr,
                 "a bf16 GEMM operand on a backend without bf16 GEMMs");
  if (g.batch == 1) {
    CONVEYOR_CUBLAS_CHECK(
        cublasGemmEx(cublas_.get(), op_b, op_a, n, m, k, &g.alpha, g.b,
                     CUDA_R_32F, ldb, g.a, CUDA_R_32F, lda, &g.beta, g.c,
                     CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  CONVEYOR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_.get(), op_b, op_a, n, m, k, &g.alpha, g.b, CUDA_R_32F, ldb,
      g.stride_b, g.a, CUDA_R_32F, lda, g.stride_a, &g.beta, g.c, CUDA_R_32F,
      ldc, g.stride_c, AsInt(g.batch, "gemm batch exceeds int"), compute,
      CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::GemmBf16(const GemmBatch& g, cublasOperation_t op_a,
                           cublasOperation_t op_b, int m, int n, int k, int lda,
                           int ldb, int ldc) {
  // Rounded copies of the spans the operands cover, in scratch memory from
  // the caching allocator (no cudaMalloc here); freed once the GEMM is
  // queued, which is safe because every kernel runs on the one stream.
  // An operand already in bf16 (a parameter's copy, made once per update)
  // is used as it is: no conversion on this call.
  const int64_t extent_a = g.a_bf16 != nullptr ? 0 : GemmExtentA(g);
  const int64_t extent_b = g.b_bf16 != nullptr ? 0 : GemmExtentB(g);
  Scratch a16 = ScratchOrDefer(extent_a * sizeof(uint16_t), "bf16 GEMM");
  Scratch b16 = ScratchOrDefer(extent_b * sizeof(uint16_t), "bf16 GEMM");
  if (!a16.ok() || !b16.ok()) return;
  if (extent_a > 0) ci::ToBf16(g.a, a16.as<uint16_t>(), extent_a, stream());
  if (extent_b > 0) ci::ToBf16(g.b, b16.as<uint16_t>(), extent_b, stream());
  const uint16_t* a = g.a_bf16 != nullptr ? g.a_bf16 : a16.as<uint16_t>();
  const uint16_t* b = g.b_bf16 != nullptr ? g.b_bf16 : b16.as<uint16_t>();
  if (g.batch == 1) {
    CONVEYOR_CUBLAS_CHECK(
        cublasGemmEx(cublas_.get(), op_b, op_a, n, m, k, &g.alpha, b,
                     CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &g.beta, g.c,
                     CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  CONVEYOR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_.get(), op_b, op_a, n, m, k, &g.alpha, b, CUDA_R_16BF, ldb,
      g.stride_b, a, CUDA_R_16BF, lda, g.stride_a, &g.beta, g.c, CUDA_R_32F,
      ldc, g.stride_c, AsInt(g.batch, "gemm batch exceeds int"),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace conveyor::engine
