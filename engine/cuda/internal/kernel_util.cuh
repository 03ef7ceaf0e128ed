// Building blocks shared by the CUDA backend's .cu files: launch shapes, an
// elementwise loop, block reductions, and the two deterministic reduction
// patterns (a scalar sum, and column sums of a matrix).
//
// Determinism: every reduction adds in an order fixed by the problem size and
// the block shape, both chosen from the problem size alone; there are no
// float atomics. The same inputs therefore give bitwise equal results on
// every run (on the same device model and build).
//
// Not API: only engine/cuda/*.cu include this. Thread-safe (stateless).
#ifndef CONVEYOR_ENGINE_CUDA_INTERNAL_KERNEL_UTIL_CUH_
#define CONVEYOR_ENGINE_CUDA_INTERNAL_KERNEL_UTIL_CUH_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/check.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/internal/kernels.h"

namespace conveyor::engine::cuda_internal {

inline constexpr int kThreads = 256;  // Elementwise block size.
// Elementwise grids stop growing here and loop instead: enough blocks to fill
// any current GPU several times over.
inline constexpr int64_t kMaxElementwiseBlocks = int64_t{1} << 16;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline unsigned ElementwiseBlocks(int64_t n) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(CeilDiv(n, kThreads), 1, kMaxElementwiseBlocks));
}

// Threads for one block per row of `cols` elements: about four elements per
// thread, a whole number of warps, a power of two for the reduction tree.
inline int RowThreads(int64_t cols) {
  int threads = 32;
  while (threads < 1024 && threads * 4 < cols) threads *= 2;
  return threads;
}

// Rows become blocks of a 1-D grid.
inline unsigned RowBlocks(int64_t rows) {
  CONVEYOR_CHECK(rows < (int64_t{1} << 31), "too many rows for one launch");
  return static_cast<unsigned>(rows);
}

inline void CheckLaunch() { CONVEYOR_CUDA_CHECK(cudaGetLastError()); }

// op(i) for i in [0, n), grid-stride.
template <typename Op>
__global__ void ForEachKernel(int64_t n, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    op(i);
  }
}

template <typename Op>
void ForEach(int64_t n, Op op, cudaStream_t stream) {
  if (n <= 0) return;
  ForEachKernel<<<ElementwiseBlocks(n), kThreads, 0, stream>>>(n, op);
  CheckLaunch();
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces `v` over the block (blockDim.x a multiple of 32, at most 1024) with
// a fixed tree; every thread gets the result. `identity` leaves a value alone
// under `op`. `shared` holds 32 values and may be reused by the next call.
template <typename T, typename Op>
__device__ T BlockReduce(T v, T* shared, Op op, T identity) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // Readers of the previous call's result are done.
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1) {
      v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
    }
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

template <typename T>
__device__ T BlockSum(T v, T* shared) {
  return BlockReduce(v, shared, SumOp(), T(0));
}
__device__ inline float BlockMax(float v, float* shared) {
  return BlockReduce(v, shared, MaxOp(), -INFINITY);
}

// --- Scalar sums: partial sums per block, then one block adds them up. -------

inline constexpr int kReduceThreads = 256;

inline int ReduceBlocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>(
      CeilDiv(n, int64_t{kReduceThreads} * 8), 1, kMaxReduceBlocks));
}

// partial[block] = sum over this block's grid-stride share of load(i).
// `load` may also write per-element outputs (the loss gradients).
template <typename Load>
__global__ void PartialSumKernel(int64_t n, Load load, double* partial) {
  __shared__ double shared[32];
  double sum = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    sum += load(i);
  }
  sum = BlockSum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// scalars->sum = sum of partial[0, blocks), in a fixed order. A template on
// the caller's Load only so that each .cu file gets its own copy.
template <typename Load>
__global__ void FinalSumKernel(const double* partial, int blocks,
                               DeviceScalars* scalars) {
  __shared__ double shared[32];
  double sum = 0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) sum += partial[i];
  sum = BlockSum(sum, shared);
  if (threadIdx.x == 0) scalars->sum = sum;
}

// scalars->sum = sum of load(i) over [0, n) in double.
template <typename Load>
void ReduceSum(int64_t n, Load load, double* partial, DeviceScalars* scalars,
               cudaStream_t stream) {
  const int blocks = ReduceBlocks(n);
  PartialSumKernel<<<blocks, kReduceThreads, 0, stream>>>(n, load, partial);
  CheckLaunch();
  FinalSumKernel<Load>
      <<<1, kReduceThreads, 0, stream>>>(partial, blocks, scalars);
  CheckLaunch();
}

// --- Column sums of a [rows, cols] matrix ------------------------------------
//
// Blocks of kColumnTile x kRowLanes threads: each block sums one chunk of
// rows for 32 adjacent columns (coalesced reads); lanes add their rows in
// order, then lane 0 adds the lanes in order. With several chunks, a second
// kernel adds the chunk sums in chunk order.

inline constexpr int kColumnTile = 32;
inline constexpr int kRowLanes = 8;

struct ColumnPlan {
  int64_t chunks = 1;
  int64_t rows_per_chunk = 0;
};

inline ColumnPlan PlanColumnSum(int64_t rows, int64_t cols) {
  // Enough blocks to keep a large GPU busy, but chunks of at least 64 rows so
  // the second pass stays small.
  constexpr int64_t kTargetBlocks = 1024, kMinRowsPerChunk = 64;
  const int64_t tiles = std::max<int64_t>(CeilDiv(cols, kColumnTile), 1);
  ColumnPlan plan;
  plan.chunks = std::clamp<int64_t>(
      kTargetBlocks / tiles, 1,
      std::max<int64_t>(CeilDiv(rows, kMinRowsPerChunk), 1));
  plan.rows_per_chunk = std::max<int64_t>(CeilDiv(rows, plan.chunks), 1);
  plan.chunks = std::max<int64_t>(CeilDiv(rows, plan.rows_per_chunk), 1);
  return plan;
}

// Where column sums go: out[j][c] = beta * out[j][c] + sum_j(c).
template <int N>
struct ColumnOutputs {
  float* out[N];
  float beta;
};

// `load(r, c, v)` fills v[0..N) with the values of element (r, c). With
// `partial` null (one chunk) the sums go straight to `outs`; otherwise to
// partial[j][chunk][c].
template <int N, typename Load>
__global__ void ColumnSumKernel(Load load, int64_t rows, int64_t cols,
                                int64_t rows_per_chunk, ColumnOutputs<N> outs,
                                float* partial) {
  __shared__ float lanes[N][kRowLanes][kColumnTile + 1];
  const int64_t c =
      static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float sum[N];
  for (int j = 0; j < N; ++j) sum[j] = 0.0f;
  if (c < cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      float v[N];
      load(r, c, v);
      for (int j = 0; j < N; ++j) sum[j] += v[j];
    }
  }
  for (int j = 0; j < N; ++j) lanes[j][threadIdx.y][threadIdx.x] = sum[j];
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int j = 0; j < N; ++j) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane)
      total += lanes[j][lane][threadIdx.x];
    if (partial == nullptr) {
      outs.out[j][c] = outs.beta * outs.out[j][c] + total;
    } else {
      partial[(j * gridDim.y + chunk) * cols + c] = total;
    }
  }
}

template <int N>
__global__ void ColumnFinishKernel(const float* partial, int64_t chunks,
                                   int64_t cols, ColumnOutputs<N> outs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       c < cols; c += stride) {
    for (int j = 0; j < N; ++j) {
      float total = 0.0f;
      for (int64_t k = 0; k < chunks; ++k)
        total += partial[(j * chunks + k) * cols + c];
      outs.out[j][c] = outs.beta * outs.out[j][c] + total;
    }
  }
}

template <int N, typename Load>
void ColumnSum(Load load, int64_t rows, int64_t cols, ColumnOutputs<N> outs,
               float* scratch, cudaStream_t stream) {
  if (cols <= 0) return;
  const ColumnPlan plan = PlanColumnSum(rows, cols);
  CONVEYOR_CHECK(plan.chunks < 65536, "too many row chunks");
  CONVEYOR_CHECK(CeilDiv(cols, kColumnTile) < (int64_t{1} << 31),
                 "too many columns for one launch");
  const dim3 grid(static_cast<unsigned>(CeilDiv(cols, kColumnTile)),
                  static_cast<unsigned>(plan.chunks));
  const dim3 block(kColumnTile, kRowLanes);
  float* partial = plan.chunks > 1 ? scratch : nullptr;
  CONVEYOR_CHECK(plan.chunks == 1 || scratch != nullptr,
                 "column sum needs scratch");
  ColumnSumKernel<N><<<grid, block, 0, stream>>>(
      load, rows, cols, plan.rows_per_chunk, outs, partial);
  CheckLaunch();
  if (plan.chunks > 1) {
    ColumnFinishKernel<N><<<ElementwiseBlocks(cols), kThreads, 0, stream>>>(
        scratch, plan.chunks, cols, outs);
    CheckLaunch();
  }
}

}  // namespace conveyor::engine::cuda_internal

#endif  // CONVEYOR_ENGINE_CUDA_INTERNAL_KERNEL_UTIL_CUH_
