// Elementwise, column-sum, optimizer and scalar-reduction kernels of the CUDA
// backend. Each one follows the CPU backend's loop of the same name
// (engine/cpu/cpu_backend.cc, cpu_nn_kernels.cc) operation for operation, so
// the two differ only by float rounding (nvcc may fuse a multiply and an add
// into one FMA; the CPU build does not).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "engine/cuda/internal/kernel_util.cuh"  // defines: ForEach, ColumnSum, ReduceSum
#include "engine/cuda/internal/kernels.h"

namespace conveyor::engine::cuda_internal {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kGeluCubic = 0.044715f;

struct FillOp {
  float* x;
  float value;
  __device__ void operator()(int64_t i) const { x[i] = value; }
};

struct ToBf16Op {
  const float* x;
  uint16_t* y;
  __device__ void operator()(int64_t i) const {
    y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
};

// Four elements a thread: one 16-byte load and one 8-byte store instead of
// four of each, for operands whose addresses allow it. The bf16 GEMM path
// rounds both operands on every call, so this copy is on every GEMM's
// critical path (the first GPU run measured the bf16 GEMMs at 0.25-0.69 of
// cuBLAS on operands rounded beforehand).
struct ToBf16x4Op {
  const float4* x;
  uint2* y;
  __device__ void operator()(int64_t i) const {
    const float4 v = x[i];
    const uint32_t lo =
        static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v.x))) |
        static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v.y)))
            << 16;
    const uint32_t hi =
        static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v.z))) |
        static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v.w)))
            << 16;
    y[i] = make_uint2(lo, hi);
  }
};

struct FromBf16Op {
  const uint16_t* x;
  float* y;
  __device__ void operator()(int64_t i) const {
    y[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
  }
};

struct ScaleOp {
  float* x;
  float alpha;
  __device__ void operator()(int64_t i) const { x[i] *= alpha; }
};

struct AxpyOp {
  float alpha;
  const float* x;
  float* y;
  __device__ void operator()(int64_t i) const { y[i] += alpha * x[i]; }
};

struct AddOp {
  const float *a, *b;
  float* out;
  __device__ void operator()(int64_t i) const { out[i] = a[i] + b[i]; }
};

struct AddRowBiasOp {
  float* x;
  const float* bias;
  int64_t cols;
  __device__ void operator()(int64_t i) const { x[i] += bias[i % cols]; }
};

struct ReluOp {
  const float* x;
  float* y;
  __device__ void operator()(int64_t i) const { y[i] = x[i] > 0 ? x[i] : 0.0f; }
};

struct ReluBackwardOp {
  const float *x, *dy;
  float* dx;
  __device__ void operator()(int64_t i) const {
    dx[i] = x[i] > 0 ? dy[i] : 0.0f;
  }
};

struct GeluOp {
  const float* x;
  float* y;
  bool tanh;
  __device__ void operator()(int64_t i) const {
    const float v = x[i];
    if (tanh) {
      y[i] = 0.5f * v *
             (1.0f + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
    } else {
      y[i] = 0.5f * v * (1.0f + erff(v * kInvSqrt2));
    }
  }
};

struct GeluBackwardOp {
  const float *x, *dy;
  float* dx;
  bool tanh;
  __device__ void operator()(int64_t i) const {
    const float v = x[i];
    if (tanh) {
      const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
      const float dt =
          (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
      dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
    } else {
      const float cdf = 0.5f * (1.0f + erff(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
  }
};

struct RowSumLoad {
  const float* x;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[1]) const {
    v[0] = x[r * cols + c];
  }
};

struct ScaleMatricesOp {
  float* c;
  int64_t m, n, ldc, stride_c;
  float beta;
  __device__ void operator()(int64_t i) const {
    const int64_t col = i % n, row = (i / n) % m, batch = i / (n * m);
    float& x = c[batch * stride_c + row * ldc + col];
    x = beta == 0.0f ? 0.0f : x * beta;
  }
};

struct SgdOp {
  SgdParams p;
  float* w;
  const float* g;
  float* buf;  // Null without momentum.
  __device__ void operator()(int64_t i) const {
    float d = g[i] + p.weight_decay * w[i];
    if (buf != nullptr) {
      buf[i] =
          p.first_step ? d : p.momentum * buf[i] + (1.0f - p.dampening) * d;
      d = p.nesterov ? d + p.momentum * buf[i] : buf[i];
    }
    w[i] -= p.lr * d;
  }
};

// One element's Adam(W) step with gradient gi, shared by the one-tensor
// and the multi-tensor kernels so both compute the same bits.
__device__ __forceinline__ void AdamElement(const AdamParams& p,
                                            float step_size, float bias2_sqrt,
                                            float gi, float& w, float& m,
                                            float& v) {
  if (p.decoupled_weight_decay) {
    w *= 1.0f - p.lr * p.weight_decay;
  } else {
    gi += p.weight_decay * w;
  }
  m = p.beta1 * m + (1.0f - p.beta1) * gi;
  v = p.beta2 * v + (1.0f - p.beta2) * gi * gi;
  const float denom = sqrtf(v) / bias2_sqrt + p.eps;
  w -= step_size * m / denom;
}

struct AdamOp {
  AdamParams p;
  float step_size, bias2_sqrt;
  float* w;
  const float* g;
  float *m, *v;
  __device__ void operator()(int64_t i) const {
    AdamElement(p, step_size, bias2_sqrt, g[i], w[i], m[i], v[i]);
  }
};

// Every tensor of `list` in one launch: the grid strides over each in turn.
// With grad_scale != 1 the gradient is scaled first and stored back, as the
// Scale kernel would.
__global__ void AdamManyKernel(AdamParams p, float step_size, float bias2_sqrt,
                               float grad_scale, AdamTensorList list) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int t = 0; t < list.count; ++t) {
    float *w = list.param[t], *g = list.grad[t], *m = list.exp_avg[t],
          *v = list.exp_avg_sq[t];
    for (int64_t i =
             static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         i < list.numel[t]; i += stride) {
      float gi = g[i];
      if (grad_scale != 1.0f) {
        gi *= grad_scale;
        g[i] = gi;
      }
      AdamElement(p, step_size, bias2_sqrt, gi, w[i], m[i], v[i]);
    }
  }
}

struct SquareLoad {
  const float* x;
  __device__ double operator()(int64_t i) const {
    const double v = x[i];
    return v * v;
  }
};

// Writes the gradient as it goes, so the loss needs one pass over memory.
struct MseLoad {
  const float *y, *t;
  float* dy;
  float grad;
  __device__ double operator()(int64_t i) const {
    const float diff = y[i] - t[i];
    dy[i] = grad * diff;
    return static_cast<double>(diff) * diff;
  }
};

__global__ void ResetScalarsKernel(DeviceScalars* scalars) {
  scalars->first_bad = kNoBadPosition;
  scalars->sum = 0.0;
  scalars->counted = 0;
}

}  // namespace

void ResetScalars(DeviceScalars* scalars, cudaStream_t stream) {
  ResetScalarsKernel<<<1, 1, 0, stream>>>(scalars);
  CheckLaunch();
}

void Fill(float* x, int64_t n, float value, cudaStream_t stream) {
  ForEach(n, FillOp{x, value}, stream);
}

void FromBf16(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  ForEach(n, FromBf16Op{x, y}, stream);
}

void ToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(x) % alignof(float4) == 0 &&
                       reinterpret_cast<uintptr_t>(y) % alignof(uint2) == 0;
  if (!aligned) {
    ForEach(n, ToBf16Op{x, y}, stream);
    return;
  }
  const int64_t groups = n / 4;
  ForEach(groups,
          ToBf16x4Op{reinterpret_cast<const float4*>(x),
                     reinterpret_cast<uint2*>(y)},
          stream);
  // The last n % 4 elements, one a thread (ForEach launches nothing for 0).
  ForEach(n - groups * 4, ToBf16Op{x + groups * 4, y + groups * 4}, stream);
}

void Scale(float* x, int64_t n, float alpha, cudaStream_t stream) {
  ForEach(n, ScaleOp{x, alpha}, stream);
}

void Axpy(float alpha, const float* x, float* y, int64_t n,
          cudaStream_t stream) {
  ForEach(n, AxpyOp{alpha, x, y}, stream);
}

void Add(const float* a, const float* b, float* out, int64_t n,
         cudaStream_t stream) {
  ForEach(n, AddOp{a, b, out}, stream);
}

void AddRowBias(float* x, const float* bias, int64_t rows, int64_t cols,
                cudaStream_t stream) {
  ForEach(rows * cols, AddRowBiasOp{x, bias, cols}, stream);
}

void Relu(const float* x, float* y, int64_t n, cudaStream_t stream) {
  ForEach(n, ReluOp{x, y}, stream);
}

void ReluBackward(const float* x, const float* dy, float* dx, int64_t n,
                  cudaStream_t stream) {
  ForEach(n, ReluBackwardOp{x, dy, dx}, stream);
}

void Gelu(const float* x, bool tanh, float* y, int64_t n, cudaStream_t stream) {
  ForEach(n, GeluOp{x, y, tanh}, stream);
}

void GeluBackward(const float* x, bool tanh, const float* dy, float* dx,
                  int64_t n, cudaStream_t stream) {
  ForEach(n, GeluBackwardOp{x, dy, dx, tanh}, stream);
}

int64_t ColumnSumScratchFloats(int64_t rows, int64_t cols, int outputs) {
  const ColumnPlan plan = PlanColumnSum(rows, cols);
  return plan.chunks > 1 ? plan.chunks * cols * outputs : 0;
}

void SumRows(const float* x, int64_t rows, int64_t cols, float beta, float* out,
             float* scratch, cudaStream_t stream) {
  ColumnSum<1>(RowSumLoad{x, cols}, rows, cols, ColumnOutputs<1>{{out}, beta},
               scratch, stream);
}

void ScaleMatrices(int64_t batch, int64_t m, int64_t n, float beta, float* c,
                   int64_t ldc, int64_t stride_c, cudaStream_t stream) {
  ForEach(batch * m * n, ScaleMatricesOp{c, m, n, ldc, stride_c, beta}, stream);
}

void SgdUpdate(const SgdParams& p, float* param, const float* grad,
               float* momentum, int64_t n, cudaStream_t stream) {
  ForEach(n, SgdOp{p, param, grad, momentum}, stream);
}

void AdamUpdate(const AdamParams& p, float step_size, float bias2_sqrt,
                float* param, const float* grad, float* exp_avg,
                float* exp_avg_sq, int64_t n, cudaStream_t stream) {
  ForEach(n, AdamOp{p, step_size, bias2_sqrt, param, grad, exp_avg, exp_avg_sq},
          stream);
}

void AdamUpdateMany(const AdamParams& p, float step_size, float bias2_sqrt,
                    float grad_scale, const AdamTensorList& list,
                    cudaStream_t stream) {
  int64_t largest = 0;
  for (int t = 0; t < list.count; ++t) {
    largest = std::max(largest, list.numel[t]);
  }
  if (largest == 0) return;
  AdamManyKernel<<<ElementwiseBlocks(largest), kThreads, 0, stream>>>(
      p, step_size, bias2_sqrt, grad_scale, list);
  CheckLaunch();
}

void SumSquares(const float* x, int64_t n, double* partial,
                DeviceScalars* scalars, cudaStream_t stream) {
  ReduceSum(n, SquareLoad{x}, partial, scalars, stream);
}

void MseLoss(const float* y, const float* target, int64_t n, float grad,
             float* dy, double* partial, DeviceScalars* scalars,
             cudaStream_t stream) {
  ReduceSum(n, MseLoad{y, target, dy, grad}, partial, scalars, stream);
}

}  // namespace conveyor::engine::cuda_internal
