// Fused attention on the CPU backend: tiled, with an online softmax, so the
// largest temporary is one [64, 64] block of scores per thread instead of the
// [B, H, S, S] probabilities of the materializing path, and a causal mask
// skips the key blocks above the diagonal instead of computing and then
// zeroing them.
//
// Each (sample, head) runs the same fixed sequence of blocks whatever the
// batch, the head count or the threads, so its result is too: replicas and
// tensor-parallel ranks stay bitwise equal to one whole stage. Blocks go
// through OpenBLAS SGEMM, one call per block (single-threaded at this size);
// the parallelism is over (sample, head, query block) tasks forward and
// (sample, key/value head) tasks backward, whose gradients of a key/value
// head sum over its group's query heads.
//
// A bf16 backend rounds every GEMM input to bfloat16 as its GEMMs do (q, k,
// v, dout, and the probability and score-gradient blocks), so the CPU stays
// the CUDA backend's numerical reference.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/internal/vector_math.h"
#include "engine/cpu/parallel.h"
#include "engine/cpu/wide_kernels.h"

namespace conveyor::engine {
namespace {

using cpu_internal::DoubleSum;
using cpu_internal::kLanes;
using cpu_internal::Load;
using cpu_internal::Splat;
using cpu_internal::Vf;

// Query rows and keys per block. Small enough that a block of scores and its
// operands stay in L1/L2, large enough that a causal mask's diagonal blocks,
// computed whole, waste little.
constexpr int64_t kBlock = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float* F(const Tensor& t) { return t.data<float>(); }

// Row-major C = alpha op(A) op(B) + beta C through OpenBLAS.
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
              ldb, beta, c, ldc);
}

void RoundInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = RoundToBf16(x[i]);
}

// The inputs of the GEMMs, rounded to bf16 when the backend is.
struct Operands {
  const float* q;
  const float* k;
  const float* v;
  const float* dout = nullptr;
  std::vector<float> rounded[4];

  Operands(bool bf16, const Tensor& tq, const Tensor& tk, const Tensor& tv,
           const Tensor* tdout)
      : q(F(tq)), k(F(tk)), v(F(tv)), dout(tdout ? F(*tdout) : nullptr) {
    if (!bf16) return;
    const float** slots[4] = {&q, &k, &v, &dout};
    const Tensor* tensors[4] = {&tq, &tk, &tv, tdout};
    for (int i = 0; i < 4; ++i) {
      if (tensors[i] == nullptr) continue;
      const float* src = *slots[i];
      std::vector<float>& copy = rounded[i];
      copy.resize(static_cast<size_t>(tensors[i]->numel()));
      float* dst = copy.data();
      ParallelFor(tensors[i]->numel(),
                  [=](int64_t j) { dst[j] = RoundToBf16(src[j]); });
      *slots[i] = copy.data();
    }
  }
};

// B, H, G, S, D of a call and the mask's view of its rows.
struct Geometry {
  int64_t batch, heads, groups, seq, dim;
  bool causal;
  const int64_t* spans;  // [B, S, 2] or nullptr.

  Geometry(const Tensor& q, const Tensor& k, const AttentionMask& mask)
      : batch(q.dim(0)),
        heads(q.dim(1)),
        groups(k.dim(1)),
        seq(q.dim(2)),
        dim(q.dim(3)),
        causal(mask.causal),
        spans(mask.spans.defined() ? mask.spans.data<int64_t>() : nullptr) {}

  // The keys [*lo, *hi) query `row` of sample `b` sees.
  void Visible(int64_t b, int64_t row, int64_t* lo, int64_t* hi) const {
    *lo = 0;
    *hi = seq;
    if (spans != nullptr) {
      const int64_t* span = spans + (b * seq + row) * 2;
      *lo = std::max<int64_t>(span[0], 0);
      *hi = std::min<int64_t>(span[1], seq);
    }
    if (causal) *hi = std::min(*hi, row + 1);
  }
};

// One block of query rows [q0, q1) of one sample: each row's visible key
// range, and their union, the key blocks the block computes.
struct RowRanges {
  int64_t lo[kBlock], hi[kBlock];
  int64_t first = 0, end = 0;

  RowRanges(const Geometry& g, int64_t b, int64_t q0, int64_t q1) {
    first = g.seq;
    for (int64_t i = 0; i < q1 - q0; ++i) {
      g.Visible(b, q0 + i, &lo[i], &hi[i]);
      if (lo[i] < hi[i]) {
        first = std::min(first, lo[i]);
        end = std::max(end, hi[i]);
      }
    }
    // Key blocks start at multiples of kBlock, so a sample's blocks are the
    // same whatever else is in the batch.
    first = first / kBlock * kBlock;
  }
};

// Per-thread scratch of n floats, reused across calls.
float* Scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& b = buffers[slot];
  if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
  return b.data();
}

// Row maximum of x[0, n) over the visible columns [lo, hi).
float RowMax(const float* x, int64_t lo, int64_t hi) {
  Vf lanes = Splat(kNegInf);
  int64_t c = lo;
  for (; c + kLanes <= hi; c += kLanes) {
    const Vf v = Load(x + c);
    lanes = v > lanes ? v : lanes;
  }
  float max =
      std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
  for (; c < hi; ++c) max = std::max(max, x[c]);
  return max;
}

// x[c] = exp(x[c] - shift) for c in [lo, hi), 0 outside [lo, hi) within
// [0, n); returns the sum of the exponentials (in double).
double ExpRow(float* x, int64_t n, int64_t lo, int64_t hi, float shift) {
  std::fill(x, x + lo, 0.0f);
  std::fill(x + hi, x + n, 0.0f);
  cpu_internal::ExpShifted(x + lo, hi - lo, shift);
  DoubleSum sum;
  int64_t c = lo;
  for (; c + kLanes <= hi; c += kLanes) sum.Add(Load(x + c));
  double tail = 0;
  for (; c < hi; ++c) tail += x[c];
  return sum.Total() + tail;
}

// Forward of query rows [q0, q1) of head `h` of sample `b`.
void ForwardBlock(const Geometry& g, const Operands& in, bool bf16, float scale,
                  int64_t b, int64_t h, int64_t q0, int64_t q1, float* out,
                  float* lse) {
  const int64_t s = g.seq, d = g.dim, rows = q1 - q0;
  const int64_t group = h / (g.heads / g.groups);
  const float* q = in.q + ((b * g.heads + h) * s + q0) * d;
  const float* k = in.k + (b * g.groups + group) * s * d;
  const float* v = in.v + (b * g.groups + group) * s * d;
  float* o = out + ((b * g.heads + h) * s + q0) * d;
  float* row_lse = lse + (b * g.heads + h) * s + q0;
  const RowRanges ranges(g, b, q0, q1);
  float* scores = Scratch(0, kBlock * kBlock);
  float max[kBlock];
  double sum[kBlock];
  std::fill(max, max + rows, kNegInf);
  std::fill(sum, sum + rows, 0.0);
  std::fill(o, o + rows * d, 0.0f);
  for (int64_t k0 = ranges.first; k0 < ranges.end; k0 += kBlock) {
    const int64_t k1 = std::min(k0 + kBlock, ranges.end), cols = k1 - k0;
    Sgemm(false, true, rows, cols, d, scale, q, d, k + k0 * d, d, 0.0f, scores,
          cols);
    for (int64_t i = 0; i < rows; ++i) {
      float* row = scores + i * cols;
      const int64_t lo = std::clamp(ranges.lo[i] - k0, int64_t{0}, cols);
      const int64_t hi = std::clamp(ranges.hi[i] - k0, int64_t{0}, cols);
      if (lo >= hi) {
        std::fill(row, row + cols, 0.0f);
        continue;
      }
      const float new_max = std::max(max[i], RowMax(row, lo, hi));
      const double block_sum = ExpRow(row, cols, lo, hi, new_max);
      if (max[i] != kNegInf && new_max != max[i]) {
        // The running sum and output were relative to the old maximum.
        const float correction = std::exp(max[i] - new_max);
        sum[i] *= correction;
        float* orow = o + i * d;
        for (int64_t c = 0; c < d; ++c) orow[c] *= correction;
      }
      sum[i] += block_sum;
      max[i] = new_max;
    }
    if (bf16) RoundInPlace(scores, rows * cols);
    Sgemm(false, false, rows, d, cols, 1.0f, scores, cols, v + k0 * d, d, 1.0f,
          o, d);
  }
  for (int64_t i = 0; i < rows; ++i) {
    if (sum[i] == 0.0) {  // No visible key: zeros, as the softmax's 0 rows.
      row_lse[i] = kNegInf;
      continue;
    }
    const float inv = static_cast<float>(1.0 / sum[i]);
    float* orow = o + i * d;
    for (int64_t c = 0; c < d; ++c) orow[c] *= inv;
    row_lse[i] = max[i] + static_cast<float>(std::log(sum[i]));
  }
}

// Backward of every query head of key/value head `group` of sample `b`:
// writes dq for those heads and dk, dv for the group.
void BackwardGroup(const Geometry& g, const Operands& in, bool bf16,
                   float scale, const float* out, const float* lse,
                   const float* dout, int64_t b, int64_t group, float* dq,
                   float* dk, float* dv) {
  const int64_t s = g.seq, d = g.dim, per_group = g.heads / g.groups;
  const int64_t kv = (b * g.groups + group) * s * d;
  const float* k = in.k + kv;
  const float* v = in.v + kv;
  float* dk_g = dk + kv;
  float* dv_g = dv + kv;
  std::fill(dk_g, dk_g + s * d, 0.0f);
  std::fill(dv_g, dv_g + s * d, 0.0f);
  float* p = Scratch(0, kBlock * kBlock);
  float* dp = Scratch(1, kBlock * kBlock);
  for (int64_t h = group * per_group; h < (group + 1) * per_group; ++h) {
    const int64_t head = (b * g.heads + h) * s;
    for (int64_t q0 = 0; q0 < s; q0 += kBlock) {
      const int64_t q1 = std::min(q0 + kBlock, s), rows = q1 - q0;
      const float* q = in.q + (head + q0) * d;
      const float* o = out + (head + q0) * d;
      const float* go = dout + (head + q0) * d;  // fp32: for delta.
      const float* go_in = in.dout + (head + q0) * d;
      const float* row_lse = lse + head + q0;
      float* dq_blk = dq + (head + q0) * d;
      std::fill(dq_blk, dq_blk + rows * d, 0.0f);
      // delta_i = sum(dout_i * out_i) = sum_j p_ij dp_ij: softmax's
      // backward term, from the output instead of the probabilities.
      float delta[kBlock];
      for (int64_t i = 0; i < rows; ++i) {
        double acc = 0;
        for (int64_t c = 0; c < d; ++c) {
          acc += static_cast<double>(go[i * d + c]) * o[i * d + c];
        }
        delta[i] = static_cast<float>(acc);
      }
      const RowRanges ranges(g, b, q0, q1);
      for (int64_t k0 = ranges.first; k0 < ranges.end; k0 += kBlock) {
        const int64_t k1 = std::min(k0 + kBlock, ranges.end), cols = k1 - k0;
        Sgemm(false, true, rows, cols, d, scale, q, d, k + k0 * d, d, 0.0f, p,
              cols);
        Sgemm(false, true, rows, cols, d, 1.0f, go_in, d, v + k0 * d, d, 0.0f,
              dp, cols);
        for (int64_t i = 0; i < rows; ++i) {
          float* prow = p + i * cols;
          float* dprow = dp + i * cols;
          const int64_t lo = std::clamp(ranges.lo[i] - k0, int64_t{0}, cols);
          const int64_t hi = std::clamp(ranges.hi[i] - k0, int64_t{0}, cols);
          if (lo >= hi || row_lse[i] == kNegInf) {
            std::fill(prow, prow + cols, 0.0f);
            std::fill(dprow, dprow + cols, 0.0f);
            continue;
          }
          ExpRow(prow, cols, lo, hi, row_lse[i]);
          // dS = P * (dP - delta); the scale is applied by the GEMMs below.
          for (int64_t c = 0; c < cols; ++c) {
            dprow[c] = prow[c] * (dprow[c] - delta[i]);
          }
        }
        if (bf16) {
          RoundInPlace(p, rows * cols);
          RoundInPlace(dp, rows * cols);
        }
        Sgemm(true, false, cols, d, rows, 1.0f, p, cols, go_in, d, 1.0f,
              dv_g + k0 * d, d);
        Sgemm(false, false, rows, d, cols, scale, dp, cols, k + k0 * d, d, 1.0f,
              dq_blk, d);
        Sgemm(true, false, cols, d, rows, scale, dp, cols, q, d, 1.0f,
              dk_g + k0 * d, d);
      }
    }
  }
}

}  // namespace

void CpuBackend::DoAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                             float scale, const AttentionMask& mask,
                             const Tensor& out, const Tensor& lse) {
  const Geometry g(q, k, mask);
  if (g.batch == 0 || g.heads == 0 || g.seq == 0) return;
  const bool bf16 = precision_ == Precision::kBf16;
  const Operands in(bf16, q, k, v, nullptr);
  const int64_t blocks = (g.seq + kBlock - 1) / kBlock;
  float* po = F(out);
  float* pl = F(lse);
  ParallelForRows(g.batch * g.heads * blocks, 2 * kBlock * g.seq * g.dim,
                  [&](int64_t task) {
                    const int64_t bh = task / blocks;
                    const int64_t q0 = task % blocks * kBlock;
                    ForwardBlock(g, in, bf16, scale, bh / g.heads, bh % g.heads,
                                 q0, std::min(q0 + kBlock, g.seq), po, pl);
                  });
}

void CpuBackend::DoAttentionBackward(const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& dout,
                                     float scale, const AttentionMask& mask,
                                     const Tensor& dq, const Tensor& dk,
                                     const Tensor& dv) {
  const Geometry g(q, k, mask);
  if (g.batch == 0 || g.heads == 0 || g.seq == 0) return;
  const bool bf16 = precision_ == Precision::kBf16;
  const Operands in(bf16, q, k, v, &dout);
  const float *po = F(out), *pl = F(lse), *pdout = F(dout);
  float *pdq = F(dq), *pdk = F(dk), *pdv = F(dv);
  ParallelForRows(
      g.batch * g.groups, 5 * (g.heads / g.groups) * g.seq * g.seq * g.dim,
      [&](int64_t task) {
        BackwardGroup(g, in, bf16, scale, po, pl, pdout, task / g.groups,
                      task % g.groups, pdq, pdk, pdv);
      });
}

}  // namespace conveyor::engine
