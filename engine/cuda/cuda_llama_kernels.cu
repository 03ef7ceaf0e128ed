// The Llama-family kernels of the CUDA backend; the CPU reference is
// engine/cpu/cpu_llama_kernels.cc. RMS norm runs one block per row and
// reduces with BlockSum (a fixed tree, bitwise repeatable); its weight
// gradient is a deterministic ColumnSum. Rotary angles follow HF's float
// computation (angle = float(pos) * inv_freq, the frequencies computed on
// the host by engine/rope.h) with full-precision sincosf, not the fast
// intrinsics: angles reach the sequence length in radians.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/cuda/internal/kernel_util.cuh"  // defines: BlockSum, ColumnSum, ForEach
#include "engine/cuda/internal/kernels.h"

namespace conveyor::engine::cuda_internal {
namespace {

__global__ void RmsNormKernel(const float* x, const float* weight, float eps,
                              int64_t cols, float* y, float* rstd) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* row = x + r * cols;
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    squares += row[c] * row[c];
  }
  const float mean = BlockSum(squares, shared) / static_cast<float>(cols);
  const float inv = 1.0f / sqrtf(mean + eps);
  if (threadIdx.x == 0) rstd[r] = inv;
  float* out = y + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[c] = weight[c] * (row[c] * inv);
  }
}

__global__ void RmsNormBackwardInputKernel(const float* x, const float* weight,
                                           const float* rstd, const float* dy,
                                           int64_t cols, float* dx) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* row = x + r * cols;
  const float* g = dy + r * cols;
  const float inv = rstd[r];
  // dx = rstd * (g - xhat * mean(g * xhat)), g = dy * weight, xhat = x rstd.
  float sum_gx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    sum_gx += g[c] * weight[c] * (row[c] * inv);
  }
  const float mean_gx = BlockSum(sum_gx, shared) / static_cast<float>(cols);
  float* out = dx + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[c] = inv * (g[c] * weight[c] - row[c] * inv * mean_gx);
  }
}

struct RmsNormWeightLoad {
  const float *x, *rstd, *dy;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[1]) const {
    v[0] = dy[r * cols + c] * (x[r * cols + c] * rstd[r]);
  }
};

__device__ float Sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

struct SiluMulOp {
  const float *gate, *up;
  float* y;
  __device__ void operator()(int64_t i) const {
    const float g = gate[i];
    y[i] = g * Sigmoid(g) * up[i];
  }
};

struct SiluMulBackwardOp {
  const float *gate, *up, *dy;
  float *dgate, *dup;
  __device__ void operator()(int64_t i) const {
    const float g = gate[i], s = Sigmoid(g);
    dup[i] = dy[i] * g * s;
    dgate[i] = dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
  }
};

// One thread per (row, pair), a row being one position of one [seq, dim]
// matrix: reads both halves before writing, so y may alias x. The rotation
// is rounded as the CPU's (no fused multiply-add), so that both backends
// agree to the accuracy of their sines and cosines.
struct RopeOp {
  const float* x;
  float* y;
  const float* inv_freq;
  const int64_t* positions;  // [batch, seq], or nullptr
  int64_t seq, dim, rows_per_batch, first_position;
  float attention_factor;
  bool inverse;
  __device__ void operator()(int64_t i) const {
    const int64_t half = dim / 2;
    const int64_t pair = i % half, row = i / half;
    const int64_t s_index = row % seq;
    const int64_t pos = positions != nullptr
                            ? positions[(row / rows_per_batch) * seq + s_index]
                            : first_position + s_index;
    float s, c;
    sincosf(__fmul_rn(static_cast<float>(pos), inv_freq[pair]), &s, &c);
    c = __fmul_rn(c, attention_factor);
    s = __fmul_rn(s, attention_factor);
    if (inverse) s = -s;
    const float* in = x + row * dim;
    float* out = y + row * dim;
    const float a = in[pair], b = in[pair + half];
    out[pair] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    out[pair + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
};

}  // namespace

void RmsNorm(const float* x, const float* weight, float eps, int64_t rows,
             int64_t cols, float* y, float* rstd, cudaStream_t stream) {
  if (rows <= 0) return;
  RmsNormKernel<<<RowBlocks(rows), RowThreads(cols), 0, stream>>>(
      x, weight, eps, cols, y, rstd);
  CheckLaunch();
}

void RmsNormBackwardInput(const float* x, const float* weight,
                          const float* rstd, const float* dy, int64_t rows,
                          int64_t cols, float* dx, cudaStream_t stream) {
  if (rows <= 0) return;
  RmsNormBackwardInputKernel<<<RowBlocks(rows), RowThreads(cols), 0, stream>>>(
      x, weight, rstd, dy, cols, dx);
  CheckLaunch();
}

void RmsNormBackwardWeight(const float* x, const float* rstd, const float* dy,
                           int64_t rows, int64_t cols, float* dweight,
                           float* scratch, cudaStream_t stream) {
  ColumnSum<1>(RmsNormWeightLoad{x, rstd, dy, cols}, rows, cols,
               ColumnOutputs<1>{{dweight}, 1.0f}, scratch, stream);
}

void SiluMul(const float* gate, const float* up, float* y, int64_t n,
             cudaStream_t stream) {
  ForEach(n, SiluMulOp{gate, up, y}, stream);
}

void SiluMulBackward(const float* gate, const float* up, const float* dy,
                     float* dgate, float* dup, int64_t n, cudaStream_t stream) {
  ForEach(n, SiluMulBackwardOp{gate, up, dy, dgate, dup}, stream);
}

void Rope(const RopeArgs& a, cudaStream_t stream) {
  if (a.rows <= 0 || a.dim <= 0) return;
  ForEach(
      a.rows * (a.dim / 2),
      RopeOp{a.x, a.y, a.inv_freq, a.positions, a.seq, a.dim, a.rows_per_batch,
             a.first_position, a.attention_factor, a.inverse},
      stream);
}

}  // namespace conveyor::engine::cuda_internal
