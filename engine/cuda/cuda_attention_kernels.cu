// Fused attention on the CUDA backend without cuDNN: the online-softmax
// kernels of our own that run when cuDNN's fused SDPA is missing or refuses a
// shape, and the device reference cuDNN's results are checked against. The
// CPU reference is engine/cpu/cpu_attention.cc.
//
// One warp per query row (forward, dq) or key row (dk, dv); each lane holds
// head_dim / 32 of the row's elements in registers, so head_dim is at most
// kMaxHeadDim. Dot products reduce with a fixed butterfly, loops run over
// keys or queries in order, and there are no atomics: dq is a loop over its
// row's keys, and dk, dv over the queries that see their key, which costs a
// second pass of the scores instead of float atomics, so results are bitwise
// repeatable like every kernel here. No [seq, seq] buffer exists; the only
// scratch is one float per query row (delta = sum(dout * out)).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/cuda/internal/kernel_util.cuh"
#include "engine/cuda/internal/kernels.h"

namespace conveyor::engine::cuda_internal {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kMaxHeadDim / 32;

__device__ __forceinline__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// x as the GEMM input a bf16 GEMM would read.
__device__ __forceinline__ float In(float x, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : x;
}

// The keys [*lo, *hi) query `row` of sample `b` sees (engine/backend.h's
// AttentionMask).
__device__ __forceinline__ void Visible(const AttentionArgs& a, int64_t b,
                                        int64_t row, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = a.seq;
  if (a.spans != nullptr) {
    const int64_t* span = a.spans + (b * a.seq + row) * 2;
    *lo = max(span[0], int64_t{0});
    *hi = min(span[1], a.seq);
  }
  if (a.causal) *hi = min(*hi, row + 1);
}

// Loads this lane's elements of a row of head_dim floats.
__device__ __forceinline__ void LoadRow(const float* row, int64_t dim,
                                        bool bf16, float (&x)[kPerLane]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    x[t] = c < dim ? In(row[c], bf16) : 0.0f;
  }
}

__device__ __forceinline__ float Dot(const float (&x)[kPerLane],
                                     const float* row, int64_t dim, bool bf16) {
  const int lane = threadIdx.x % 32;
  float sum = 0.0f;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < dim) sum += x[t] * In(row[c], bf16);
  }
  return WarpSum(sum);
}

// Grids are (matrices, row blocks): blockIdx.x is the (sample, head) or
// (sample, group), and warp w of row block y owns row y * warps + w; row
// blocks past the grid's 65535 loop.
#define CONVEYOR_FOR_EACH_ROW(row)                                   \
  for (int64_t row = blockIdx.y * kWarpsPerBlock + threadIdx.x / 32; \
       row < a.seq; row += static_cast<int64_t>(gridDim.y) * kWarpsPerBlock)

__device__ void ForwardRow(const AttentionArgs& a, const float* q,
                           const float* k, const float* v, float* out,
                           float* lse, int64_t row) {
  const int64_t bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int64_t group = h / (a.heads / a.groups);
  const int64_t d = a.dim;
  const float* k_rows = k + (b * a.groups + group) * a.seq * d;
  const float* v_rows = v + (b * a.groups + group) * a.seq * d;
  float qr[kPerLane], o[kPerLane];
  LoadRow(q + (bh * a.seq + row) * d, d, a.bf16, qr);
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) o[t] = 0.0f;
  int64_t lo, hi;
  Visible(a, b, row, &lo, &hi);
  float max = -INFINITY, sum = 0.0f;
  const int lane = threadIdx.x % 32;
  for (int64_t j = lo; j < hi; ++j) {
    const float s = a.scale * Dot(qr, k_rows + j * d, d, a.bf16);
    const float new_max = fmaxf(max, s);
    const float correction = max == -INFINITY ? 0.0f : expf(max - new_max);
    const float p = expf(s - new_max);
    sum = sum * correction + p;
    const float pv = In(p, a.bf16);
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      const float vc = c < d ? In(v_rows[j * d + c], a.bf16) : 0.0f;
      o[t] = o[t] * correction + pv * vc;
    }
    max = new_max;
  }
  float* orow = out + (bh * a.seq + row) * d;
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < d) orow[c] = o[t] * inv;
  }
  if (lane == 0) {
    lse[bh * a.seq + row] = sum > 0.0f ? max + logf(sum) : -INFINITY;
  }
}

__global__ void AttentionForwardKernel(AttentionArgs a, const float* q,
                                       const float* k, const float* v,
                                       float* out, float* lse) {
  CONVEYOR_FOR_EACH_ROW(row) { ForwardRow(a, q, k, v, out, lse, row); }
}

// dq and delta of one query row.
__device__ void BackwardQueryRow(const AttentionArgs& a, const float* q,
                                 const float* k, const float* v,
                                 const float* out, const float* lse,
                                 const float* dout, float* dq, float* delta,
                                 int64_t row) {
  const int64_t bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int64_t group = h / (a.heads / a.groups);
  const int64_t d = a.dim, at = bh * a.seq + row;
  const float* k_rows = k + (b * a.groups + group) * a.seq * d;
  const float* v_rows = v + (b * a.groups + group) * a.seq * d;
  const int lane = threadIdx.x % 32;
  float qr[kPerLane], go[kPerLane], acc[kPerLane];
  LoadRow(q + at * d, d, a.bf16, qr);
  LoadRow(dout + at * d, d, a.bf16, go);
  // delta = sum(dout * out) in fp32 operands, as the CPU computes it.
  float partial = 0.0f;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    acc[t] = 0.0f;
    if (c < d) partial += dout[at * d + c] * out[at * d + c];
  }
  const float dl = WarpSum(partial);
  if (lane == 0) delta[at] = dl;
  const float row_lse = lse[at];
  int64_t lo, hi;
  Visible(a, b, row, &lo, &hi);
  if (row_lse == -INFINITY) hi = lo;
  for (int64_t j = lo; j < hi; ++j) {
    const float p =
        expf(a.scale * Dot(qr, k_rows + j * d, d, a.bf16) - row_lse);
    const float dp = Dot(go, v_rows + j * d, d, a.bf16);
    const float ds = In(p * (dp - dl), a.bf16);
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < d) acc[t] += ds * In(k_rows[j * d + c], a.bf16);
    }
  }
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < d) dq[at * d + c] = a.scale * acc[t];
  }
}

__global__ void AttentionBackwardQueryKernel(AttentionArgs a, const float* q,
                                             const float* k, const float* v,
                                             const float* out, const float* lse,
                                             const float* dout, float* dq,
                                             float* delta) {
  CONVEYOR_FOR_EACH_ROW(row) {
    BackwardQueryRow(a, q, k, v, out, lse, dout, dq, delta, row);
  }
}

// dk and dv of one key row of a (sample, group): sums over every query head
// of the group and every query that sees the key, in order.
__device__ void BackwardKeyRow(const AttentionArgs& a, const float* q,
                               const float* k, const float* v, const float* lse,
                               const float* dout, const float* delta, float* dk,
                               float* dv, int64_t key) {
  const int64_t bg = blockIdx.x, b = bg / a.groups, group = bg % a.groups;
  const int64_t per_group = a.heads / a.groups, d = a.dim;
  const int lane = threadIdx.x % 32;
  float kr[kPerLane], vr[kPerLane], gk[kPerLane], gv[kPerLane];
  LoadRow(k + (bg * a.seq + key) * d, d, a.bf16, kr);
  LoadRow(v + (bg * a.seq + key) * d, d, a.bf16, vr);
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) gk[t] = gv[t] = 0.0f;
  // Under a causal mask no query before the key sees it.
  const int64_t first = a.causal ? key : 0;
  for (int64_t h = group * per_group; h < (group + 1) * per_group; ++h) {
    const int64_t head = (b * a.heads + h) * a.seq;
    for (int64_t i = first; i < a.seq; ++i) {
      int64_t lo, hi;
      Visible(a, b, i, &lo, &hi);
      const float row_lse = lse[head + i];
      if (key < lo || key >= hi || row_lse == -INFINITY) continue;
      const float* qrow = q + (head + i) * d;
      const float* grow = dout + (head + i) * d;
      const float p = expf(a.scale * Dot(kr, qrow, d, a.bf16) - row_lse);
      const float dp = Dot(vr, grow, d, a.bf16);
      const float pv = In(p, a.bf16);
      const float ds = In(p * (dp - delta[head + i]), a.bf16);
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int64_t c = lane + 32 * t;
        if (c < d) {
          gv[t] += pv * In(grow[c], a.bf16);
          gk[t] += ds * In(qrow[c], a.bf16);
        }
      }
    }
  }
  float* dk_row = dk + (bg * a.seq + key) * d;
  float* dv_row = dv + (bg * a.seq + key) * d;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < d) {
      dk_row[c] = a.scale * gk[t];
      dv_row[c] = gv[t];
    }
  }
}

__global__ void AttentionBackwardKeyKernel(AttentionArgs a, const float* q,
                                           const float* k, const float* v,
                                           const float* lse, const float* dout,
                                           const float* delta, float* dk,
                                           float* dv) {
  CONVEYOR_FOR_EACH_ROW(key) {
    BackwardKeyRow(a, q, k, v, lse, dout, delta, dk, dv, key);
  }
}

#undef CONVEYOR_FOR_EACH_ROW

dim3 Grid(const AttentionArgs& a, int64_t matrices) {
  const int64_t row_blocks = (a.seq + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return dim3(static_cast<unsigned>(matrices),
              static_cast<unsigned>(std::min<int64_t>(row_blocks, 65535)));
}

}  // namespace

void AttentionForward(const AttentionArgs& a, const float* q, const float* k,
                      const float* v, float* out, float* lse,
                      cudaStream_t stream) {
  if (a.batch <= 0 || a.heads <= 0 || a.seq <= 0) return;
  AttentionForwardKernel<<<Grid(a, a.batch * a.heads), 32 * kWarpsPerBlock, 0,
                           stream>>>(a, q, k, v, out, lse);
  CheckLaunch();
}

void AttentionBackward(const AttentionArgs& a, const float* q, const float* k,
                       const float* v, const float* out, const float* lse,
                       const float* dout, float* dq, float* dk, float* dv,
                       float* delta, cudaStream_t stream) {
  if (a.batch <= 0 || a.heads <= 0 || a.seq <= 0) return;
  AttentionBackwardQueryKernel<<<Grid(a, a.batch * a.heads),
                                 32 * kWarpsPerBlock, 0, stream>>>(
      a, q, k, v, out, lse, dout, dq, delta);
  CheckLaunch();
  AttentionBackwardKeyKernel<<<Grid(a, a.batch * a.groups), 32 * kWarpsPerBlock,
                               0, stream>>>(a, q, k, v, lse, dout, delta, dk,
                                            dv);
  CheckLaunch();
}

}  // namespace conveyor::engine::cuda_internal
