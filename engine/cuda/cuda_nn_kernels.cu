// Normalization, attention, embedding and cross-entropy kernels of the CUDA
// backend; the CPU reference is engine/cpu/cpu_nn_kernels.cc. Row-wise
// kernels run one block per row and reduce with BlockSum/BlockMax, whose
// fixed trees keep results bitwise repeatable.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>  // defines: cub::DeviceRadixSort

#include "engine/cuda/internal/kernel_util.cuh"  // defines: BlockSum, ColumnSum, ReduceSum
#include "engine/cuda/internal/kernels.h"
#include "engine/loss_kind.h"

namespace conveyor::engine::cuda_internal {
namespace {

// --- Layer normalization -----------------------------------------------------

__global__ void LayerNormKernel(const float* x, const float* gamma,
                                const float* beta, float eps, int64_t cols,
                                float* y, float* mean, float* rstd) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* row = x + r * cols;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += row[c];
  const float mu = BlockSum(sum, shared) / static_cast<float>(cols);
  // Two passes, as the CPU does: the variance of the centred values does not
  // lose digits when the mean is large.
  float var = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = row[c] - mu;
    var += d * d;
  }
  var = BlockSum(var, shared) / static_cast<float>(cols);
  const float inv = 1.0f / sqrtf(var + eps);
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = inv;
  }
  float* out = y + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = (row[c] - mu) * inv;
    if (gamma != nullptr) v *= gamma[c];
    if (beta != nullptr) v += beta[c];
    out[c] = v;
  }
}

__global__ void LayerNormBackwardInputKernel(const float* x, const float* gamma,
                                             const float* mean,
                                             const float* rstd, const float* dy,
                                             int64_t cols, float* dx) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* row = x + r * cols;
  const float* g = dy + r * cols;
  const float mu = mean[r], inv = rstd[r];
  // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float dxhat = gamma != nullptr ? g[c] * gamma[c] : g[c];
    sum_g += dxhat;
    sum_gx += dxhat * (row[c] - mu) * inv;
  }
  const float mean_g = BlockSum(sum_g, shared) / static_cast<float>(cols);
  const float mean_gx = BlockSum(sum_gx, shared) / static_cast<float>(cols);
  float* out = dx + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float dxhat = gamma != nullptr ? g[c] * gamma[c] : g[c];
    const float xhat = (row[c] - mu) * inv;
    out[c] = inv * (dxhat - mean_g - xhat * mean_gx);
  }
}

struct LayerNormWeightLoad {
  const float *x, *mean, *rstd, *dy;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[2]) const {
    const float g = dy[r * cols + c];
    v[0] = g * (x[r * cols + c] - mean[r]) * rstd[r];
    v[1] = g;
  }
};

// --- Softmax -----------------------------------------------------------------

// With `spans` (I64 [samples, seq, 2], `heads` score matrices per sample),
// query q sees the keys of its document's [first, end) only. With `lse`,
// each row's log-sum-exp of its scaled, unmasked entries (-inf for a row
// that sees none): the fused attention's statistic.
__global__ void SoftmaxKernel(const float* x, float scale, bool causal,
                              int64_t rows_per_matrix, int64_t cols,
                              const int64_t* spans, int64_t heads, float* y,
                              float* lse) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* in = x + r * cols;
  float* out = y + r * cols;
  const int64_t q = r % rows_per_matrix;
  int64_t lo = 0, hi = cols;
  if (spans != nullptr) {
    const int64_t* span =
        spans + ((r / rows_per_matrix / heads) * cols + q) * 2;
    lo = span[0];
    hi = span[1];
  }
  // With a causal mask, query row q sees keys up to q.
  if (causal) hi = min(hi, q + 1);
  float max = -INFINITY;
  for (int64_t c = lo + threadIdx.x; c < hi; c += blockDim.x) {
    max = fmaxf(max, scale * in[c]);
  }
  max = BlockMax(max, shared);
  float sum = 0.0f;
  for (int64_t c = lo + threadIdx.x; c < hi; c += blockDim.x) {
    const float e = expf(scale * in[c] - max);
    out[c] = e;
    sum += e;
  }
  const float total = BlockSum(sum, shared);
  const float inv = 1.0f / total;
  if (lse != nullptr && threadIdx.x == 0) {
    lse[r] = total > 0.0f ? max + logf(total) : -INFINITY;
  }
  // Each thread rescales the entries it wrote itself: no barrier needed.
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[c] = c >= lo && c < hi ? out[c] * inv : 0.0f;
  }
}

__global__ void SoftmaxBackwardKernel(const float* y, const float* dy,
                                      float scale, int64_t cols, float* dx) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* yr = y + r * cols;
  const float* gr = dy + r * cols;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dot += yr[c] * gr[c];
  }
  dot = BlockSum(dot, shared);
  float* out = dx + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[c] = scale * yr[c] * (gr[c] - dot);
  }
}

// --- Head layout -------------------------------------------------------------

// Element i of q, k or v [B, H, S, D] (p picks which) and its place in qkv
// [B, S, 3, H, D]; one thread per element, coalesced on the split side.
struct PermuteQkvOp {
  float* qkv;
  float* parts[3];
  int64_t seq, heads, dim;
  bool to_heads;
  __device__ void operator()(int64_t e) const {
    const int64_t per_part = seq * heads * dim;  // One sample of one part.
    const int64_t i = e % dim;
    int64_t t = e / dim;
    const int64_t s = t % seq;
    t /= seq;
    const int64_t h = t % heads;
    t /= heads;
    const int64_t p = t % 3, b = t / 3;
    float* packed = qkv + (((b * seq + s) * 3 + p) * heads + h) * dim + i;
    float* split = parts[p] + b * per_part + (h * seq + s) * dim + i;
    if (to_heads) {
      *split = *packed;
    } else {
      *packed = *split;
    }
  }
};

struct PermuteMergeOp {
  float *x, *merged;
  int64_t heads, seq, dim;
  bool to_merged;
  __device__ void operator()(int64_t e) const {
    const int64_t i = e % dim;
    int64_t t = e / dim;
    const int64_t s = t % seq;
    t /= seq;
    const int64_t h = t % heads, b = t / heads;
    float* split = x + e;
    float* m = merged + ((b * seq + s) * heads + h) * dim + i;
    if (to_merged) {
      *m = *split;
    } else {
      *split = *m;
    }
  }
};

// --- Embedding ---------------------------------------------------------------

struct EmbeddingForwardOp {
  const int64_t* ids;
  const float* table;
  int64_t vocab, dim;
  float* out;
  DeviceScalars* scalars;
  __device__ void operator()(int64_t e) const {
    const int64_t i = e / dim, c = e % dim;
    const int64_t id = ids[i];
    if (id >= 0 && id < vocab) {
      out[e] = table[id * dim + c];
    } else {
      // Integer atomicMin: the result is the same whatever the order.
      out[e] = 0.0f;
      if (c == 0)
        atomicMin(&scalars->first_bad, static_cast<unsigned long long>(i));
    }
  }
};

// Sort keys: the id, or `vocab` (sorted last, then skipped) when out of
// range; values: positions 0..n-1.
struct EmbeddingKeysOp {
  const int64_t* ids;
  int64_t vocab;
  uint64_t* keys;
  int32_t* positions;
  __device__ void operator()(int64_t i) const {
    const int64_t id = ids[i];
    keys[i] = static_cast<uint64_t>(id >= 0 && id < vocab ? id : vocab);
    positions[i] = static_cast<int32_t>(i);
  }
};

constexpr int kEmbeddingColumns = 128;  // Threads per block, over columns.

// Block (p, column tile): if sorted position p starts a run of equal ids, adds
// that run's dy rows to the id's table row in ascending token order (the
// stable sort kept it), exactly as the CPU's sequential loop does.
__global__ void EmbeddingAccumulateKernel(const uint64_t* keys,
                                          const int32_t* positions, int64_t n,
                                          const float* dy, uint64_t vocab,
                                          int64_t dim, float* dtable) {
  const int64_t p = blockIdx.x;
  const uint64_t key = keys[p];
  if (key >= vocab || (p > 0 && keys[p - 1] == key)) return;
  const int64_t c =
      static_cast<int64_t>(blockIdx.y) * kEmbeddingColumns + threadIdx.x;
  if (c >= dim) return;
  float* row = dtable + static_cast<int64_t>(key) * dim + c;
  float acc = *row;
  for (int64_t j = p; j < n && keys[j] == key; ++j) {
    acc += dy[static_cast<int64_t>(positions[j]) * dim + c];
  }
  *row = acc;
}

// Scratch layout of EmbeddingBackward, each part 256-byte aligned: keys in
// and out, positions in and out, then CUB's temporary storage.
struct EmbeddingScratch {
  size_t keys_in = 0, keys_out = 0, positions_in = 0, positions_out = 0,
         cub = 0, cub_bytes = 0, total = 0;
};

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bits that hold every key up to and including the `vocab` sentinel: fewer
// radix passes than sorting all 64.
int KeyBits(int64_t vocab) {
  return std::max(
      1, static_cast<int>(std::bit_width(static_cast<uint64_t>(vocab))));
}

EmbeddingScratch PlanEmbeddingScratch(int64_t n, int64_t vocab) {
  // CUB counts items in int; positions are int32.
  CONVEYOR_CHECK(n < (int64_t{1} << 31), "too many tokens for one sort");
  CONVEYOR_CHECK(vocab < (int64_t{1} << 62), "vocabulary too large");
  EmbeddingScratch s;
  const size_t key_bytes = Align256(n * sizeof(uint64_t));
  const size_t position_bytes = Align256(n * sizeof(int32_t));
  s.keys_in = 0;
  s.keys_out = s.keys_in + key_bytes;
  s.positions_in = s.keys_out + key_bytes;
  s.positions_out = s.positions_in + position_bytes;
  s.cub = s.positions_out + position_bytes;
  // With a null buffer CUB only reports the bytes it needs; nothing runs.
  CONVEYOR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, s.cub_bytes, static_cast<const uint64_t*>(nullptr),
      static_cast<uint64_t*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int>(n), 0, KeyBits(vocab)));
  s.total = s.cub + Align256(s.cub_bytes);
  return s;
}

// --- Cross-entropy -----------------------------------------------------------

// Counts the targets that are not kIgnoredTarget into scalars->counted, so
// that the loss kernel can scale by the mean over them without a round trip
// to the host.
__global__ void CountTargetsKernel(const int64_t* targets, int64_t n,
                                   DeviceScalars* scalars) {
  unsigned long long mine = 0;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    mine += targets[i] != kIgnoredTarget;
  }
  if (mine != 0) atomicAdd(&scalars->counted, mine);
}

__global__ void CrossEntropyKernel(const float* logits, const int64_t* targets,
                                   int64_t vocab, float grad_scale,
                                   float* dlogits, double* row_loss,
                                   DeviceScalars* scalars) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const int64_t target = targets[r];
  float* out = dlogits + r * vocab;
  if (target == kIgnoredTarget) {
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) out[c] = 0.0f;
    return;
  }
  if (target < 0 || target >= vocab) {
    // The whole block sees the same target, so it leaves together.
    if (threadIdx.x == 0) {
      row_loss[r] = 0.0;
      atomicMin(&scalars->first_bad, static_cast<unsigned long long>(r));
    }
    return;
  }
  const float* in = logits + r * vocab;
  // The mean over the counted rows (at least this one).
  const unsigned long long counted = scalars->counted;
  const float grad = grad_scale / static_cast<float>(counted > 0 ? counted : 1);
  float max = -INFINITY;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    max = fmaxf(max, in[c]);
  }
  max = BlockMax(max, shared);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    sum += expf(in[c] - max);
  }
  const float log_sum = logf(BlockSum(sum, shared));
  if (threadIdx.x == 0) {
    row_loss[r] = static_cast<double>(log_sum) - (in[target] - max);
  }
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float p = grad * expf(in[c] - max - log_sum);
    out[c] = c == target ? p - grad : p;
  }
}

struct RowLossLoad {
  const double* row_loss;
  __device__ double operator()(int64_t i) const { return row_loss[i]; }
};

}  // namespace

void LayerNorm(const float* x, const float* gamma, const float* beta, float eps,
               int64_t rows, int64_t cols, float* y, float* mean, float* rstd,
               cudaStream_t stream) {
  if (rows <= 0) return;
  LayerNormKernel<<<RowBlocks(rows), RowThreads(cols), 0, stream>>>(
      x, gamma, beta, eps, cols, y, mean, rstd);
  CheckLaunch();
}

void LayerNormBackwardInput(const float* x, const float* gamma,
                            const float* mean, const float* rstd,
                            const float* dy, int64_t rows, int64_t cols,
                            float* dx, cudaStream_t stream) {
  if (rows <= 0) return;
  LayerNormBackwardInputKernel<<<RowBlocks(rows), RowThreads(cols), 0,
                                 stream>>>(x, gamma, mean, rstd, dy, cols, dx);
  CheckLaunch();
}

void LayerNormBackwardWeight(const float* x, const float* mean,
                             const float* rstd, const float* dy, int64_t rows,
                             int64_t cols, float* dgamma, float* dbeta,
                             float* scratch, cudaStream_t stream) {
  ColumnSum<2>(LayerNormWeightLoad{x, mean, rstd, dy, cols}, rows, cols,
               ColumnOutputs<2>{{dgamma, dbeta}, 1.0f}, scratch, stream);
}

void Softmax(const float* x, float scale, bool causal, int64_t rows,
             int64_t rows_per_matrix, int64_t cols, float* y, float* lse,
             cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  SoftmaxKernel<<<RowBlocks(rows), RowThreads(cols), 0, stream>>>(
      x, scale, causal, rows_per_matrix, cols, nullptr, 1, y, lse);
  CheckLaunch();
}

void SoftmaxInSpans(const float* x, float scale, bool causal, int64_t rows,
                    int64_t seq, const int64_t* spans, int64_t heads, float* y,
                    float* lse, cudaStream_t stream) {
  if (rows <= 0 || seq <= 0) return;
  SoftmaxKernel<<<RowBlocks(rows), RowThreads(seq), 0, stream>>>(
      x, scale, causal, seq, seq, spans, heads, y, lse);
  CheckLaunch();
}

void SoftmaxBackward(const float* y, const float* dy, float scale, int64_t rows,
                     int64_t cols, float* dx, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  SoftmaxBackwardKernel<<<RowBlocks(rows), RowThreads(cols), 0, stream>>>(
      y, dy, scale, cols, dx);
  CheckLaunch();
}

void PermuteQkv(float* qkv, int64_t batch, int64_t seq, int64_t heads,
                int64_t head_dim, float* q, float* k, float* v, bool to_heads,
                cudaStream_t stream) {
  ForEach(3 * batch * heads * seq * head_dim,
          PermuteQkvOp{qkv, {q, k, v}, seq, heads, head_dim, to_heads}, stream);
}

void PermuteMerge(float* x, int64_t batch, int64_t heads, int64_t seq,
                  int64_t head_dim, float* merged, bool to_merged,
                  cudaStream_t stream) {
  ForEach(batch * heads * seq * head_dim,
          PermuteMergeOp{x, merged, heads, seq, head_dim, to_merged}, stream);
}

void EmbeddingForward(const int64_t* ids, int64_t n, const float* table,
                      int64_t vocab, int64_t dim, float* out,
                      DeviceScalars* scalars, cudaStream_t stream) {
  ForEach(n * dim, EmbeddingForwardOp{ids, table, vocab, dim, out, scalars},
          stream);
}

size_t EmbeddingBackwardScratchBytes(int64_t n, int64_t vocab) {
  return PlanEmbeddingScratch(n, vocab).total;
}

void EmbeddingBackward(const int64_t* ids, int64_t n, const float* dy,
                       int64_t vocab, int64_t dim, float* dtable, void* scratch,
                       size_t scratch_bytes, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  const EmbeddingScratch plan = PlanEmbeddingScratch(n, vocab);
  CONVEYOR_CHECK(scratch_bytes >= plan.total, "embedding scratch too small");
  char* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<uint64_t*>(base + plan.keys_in);
  auto* keys_out = reinterpret_cast<uint64_t*>(base + plan.keys_out);
  auto* positions_in = reinterpret_cast<int32_t*>(base + plan.positions_in);
  auto* positions_out = reinterpret_cast<int32_t*>(base + plan.positions_out);
  ForEach(n, EmbeddingKeysOp{ids, vocab, keys_in, positions_in}, stream);
  size_t cub_bytes = plan.cub_bytes;
  // Radix sort is stable: equal ids keep ascending positions.
  CONVEYOR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      base + plan.cub, cub_bytes, keys_in, keys_out, positions_in,
      positions_out, static_cast<int>(n), 0, KeyBits(vocab), stream));
  const int64_t tiles = CeilDiv(dim, kEmbeddingColumns);
  CONVEYOR_CHECK(tiles < 65536, "embedding rows too wide for one launch");
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(tiles));
  EmbeddingAccumulateKernel<<<grid, kEmbeddingColumns, 0, stream>>>(
      keys_out, positions_out, n, dy, static_cast<uint64_t>(vocab), dim,
      dtable);
  CheckLaunch();
}

void CrossEntropyLoss(const float* logits, const int64_t* targets, int64_t n,
                      int64_t vocab, float grad_scale, float* dlogits,
                      double* row_loss, double* partial, DeviceScalars* scalars,
                      cudaStream_t stream) {
  if (n <= 0) return;
  CountTargetsKernel<<<static_cast<unsigned>(
                           std::min<int64_t>((n + 255) / 256, 1024)),
                       256, 0, stream>>>(targets, n, scalars);
  CheckLaunch();
  CrossEntropyKernel<<<RowBlocks(n), RowThreads(vocab), 0, stream>>>(
      logits, targets, vocab, grad_scale, dlogits, row_loss, scalars);
  CheckLaunch();
  ReduceSum(n, RowLossLoad{row_loss}, partial, scalars, stream);
}

}  // namespace conveyor::engine::cuda_internal
