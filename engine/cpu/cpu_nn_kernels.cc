// Normalization, attention, embedding, loss and optimizer kernels of the CPU
// backend. Reductions accumulate in double so results do not depend on the
// thread count and stay close to a float64 reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/internal/vector_math.h"
#include "engine/cpu/parallel.h"
#include "engine/loss_kind.h"
#include "engine/precision.h"

namespace conveyor::engine {
namespace {

using cpu_internal::DoubleSum;
using cpu_internal::Exp;
using cpu_internal::ForChunks;
using cpu_internal::ForColumnBands;
using cpu_internal::kLanes;
using cpu_internal::Load;
using cpu_internal::LoadPartial;
using cpu_internal::ScaledMax;
using cpu_internal::Scratch;
using cpu_internal::Splat;
using cpu_internal::Sqrt;
using cpu_internal::Store;
using cpu_internal::StorePartial;
using cpu_internal::Vd;
using cpu_internal::Vf;

float* F(const Tensor& t) { return t.data<float>(); }

// The position of the first id outside [0, limit), or -1. Ids come from
// data, so a bad one is the caller's InvalidArgument, not a bug.
int64_t FirstOutOfRange(const int64_t* ids, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= limit) return i;
  }
  return -1;
}

}  // namespace

void CpuBackend::DoLayerNorm(const Tensor& x, const Tensor& gamma,
                             const Tensor& beta, float eps, const Tensor& y,
                             const Tensor& mean, const Tensor& rstd) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  const float* px = F(x);
  const float* pg = gamma.defined() ? F(gamma) : nullptr;
  const float* pb = beta.defined() ? F(beta) : nullptr;
  float *py = F(y), *pm = F(mean), *pr = F(rstd);
  const int64_t body = cols / kLanes * kLanes;
  ParallelForRows(rows, cols, [=](int64_t r) {
    const float* row = px + r * cols;
    DoubleSum sum;
    for (int64_t c = 0; c < body; c += kLanes) sum.Add(Load(row + c));
    if (body < cols) sum.Add(LoadPartial(row + body, cols - body));
    const double mu = sum.Total() / cols;
    // Two passes: the variance of the centred values does not cancel.
    const Vf mu_v = Splat(static_cast<float>(mu));
    DoubleSum var;
    for (int64_t c = 0; c < body; c += kLanes) {
      const Vf d = Load(row + c) - mu_v;
      var.Add(d * d);
    }
    double tail_var = 0;
    for (int64_t c = body; c < cols; ++c) {
      const double d = row[c] - static_cast<float>(mu);
      tail_var += d * d;
    }
    const double variance = (var.Total() + tail_var) / cols;
    const float inv = static_cast<float>(1.0 / std::sqrt(variance + eps));
    pm[r] = static_cast<float>(mu);
    pr[r] = inv;
    float* out = py + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float v = (row[c] - static_cast<float>(mu)) * inv;
      if (pg) v *= pg[c];
      if (pb) v += pb[c];
      out[c] = v;
    }
  });
}

void CpuBackend::DoLayerNormBackwardInput(const Tensor& x, const Tensor& gamma,
                                          const Tensor& mean,
                                          const Tensor& rstd, const Tensor& dy,
                                          const Tensor& dx) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  const float *px = F(x), *pm = F(mean), *pr = F(rstd), *pdy = F(dy);
  const float* pg = gamma.defined() ? F(gamma) : nullptr;
  float* pdx = F(dx);
  ParallelForRows(rows, cols, [=](int64_t r) {
    const float* row = px + r * cols;
    const float* g = pdy + r * cols;
    const float mu = pm[r], inv = pr[r];
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    auto dxhat = [=](int64_t c, int64_t n) {
      const Vf gv = LoadPartial(g + c, n);
      return pg ? gv * LoadPartial(pg + c, n) : gv;
    };
    auto xhat = [=](int64_t c, int64_t n) {
      return (LoadPartial(row + c, n) - mu) * inv;
    };
    // Full vectors pass n = kLanes, a constant, so their loads are plain.
    DoubleSum sum_g, sum_gx;
    auto accumulate = [&](int64_t c, int64_t n) {
      const Vf d = dxhat(c, n);
      sum_g.Add(d);
      sum_gx.Add(d * xhat(c, n));  // Padding lanes are 0 * xhat = 0.
    };
    int64_t c = 0;
    for (; c + kLanes <= cols; c += kLanes) accumulate(c, kLanes);
    if (c < cols) accumulate(c, cols - c);
    const float mean_g = static_cast<float>(sum_g.Total() / cols);
    const float mean_gx = static_cast<float>(sum_gx.Total() / cols);
    float* out = pdx + r * cols;
    auto write = [&](int64_t c, int64_t n) {
      StorePartial(out + c, inv * (dxhat(c, n) - mean_g - xhat(c, n) * mean_gx),
                   n);
    };
    for (c = 0; c + kLanes <= cols; c += kLanes) write(c, kLanes);
    if (c < cols) write(c, cols - c);
  });
}

void CpuBackend::DoLayerNormBackwardWeight(const Tensor& x, const Tensor& mean,
                                           const Tensor& rstd, const Tensor& dy,
                                           const Tensor& dgamma,
                                           const Tensor& dbeta) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  const float *px = F(x), *pm = F(mean), *pr = F(rstd), *pdy = F(dy);
  float *pdg = F(dgamma), *pdb = F(dbeta);
  // Row by row into per-column double sums, as DoSumRows: contiguous reads,
  // and each column sums its rows in order whatever the thread count.
  ForColumnBands(rows, cols, [=](int64_t begin, int64_t end) {
    const int64_t width = end - begin;
    double* sg = Scratch(2 * width);
    double* sb = sg + width;
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = px + r * cols + begin;
      const float* gr = pdy + r * cols + begin;
      const float mu = pm[r], inv = pr[r];
      for (int64_t c = 0; c < width; ++c) {
        sg[c] += gr[c] * ((xr[c] - mu) * inv);
        sb[c] += gr[c];
      }
    }
    for (int64_t c = 0; c < width; ++c) {
      pdg[begin + c] += static_cast<float>(sg[c]);
      pdb[begin + c] += static_cast<float>(sb[c]);
    }
  });
}

namespace {

// Softmax of scale * in over columns [lo, hi) into out, the other columns
// 0: the masked rows of causal and document attention.
void SoftmaxRow(const float* in, float* out, int64_t lo, int64_t hi,
                int64_t cols, float scale) {
  const int64_t visible = hi - lo;
  const int64_t body = visible / kLanes * kLanes;
  const float max = ScaledMax(in + lo, visible, scale);
  // exp(scale * x - max) into out, summed in double; the tail's padding
  // lanes are not stored and not summed.
  DoubleSum sum;
  for (int64_t c = 0; c < body; c += kLanes) {
    const Vf e = Exp(scale * Load(in + lo + c) - max);
    Store(out + lo + c, e);
    sum.Add(e);
  }
  if (body < visible) {
    const int64_t n = visible - body;
    Vf e = Exp(scale * LoadPartial(in + lo + body, n) - max);
    for (int64_t i = n; i < kLanes; ++i) e[i] = 0.0f;
    StorePartial(out + lo + body, e, n);
    sum.Add(e);
  }
  const float inv = static_cast<float>(1.0 / sum.Total());
  for (int64_t c = 0; c < lo; ++c) out[c] = 0.0f;
  for (int64_t c = lo; c < hi; ++c) out[c] *= inv;
  for (int64_t c = hi; c < cols; ++c) out[c] = 0.0f;
}

}  // namespace

void CpuBackend::DoSoftmax(const Tensor& x, float scale, bool causal,
                           const Tensor& y) {
  const int64_t cols = x.dim(-1);
  const int64_t rows_per = x.rank() >= 2 ? x.dim(-2) : 1;
  const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
  const float* px = F(x);
  float* py = F(y);
  ParallelForRows(rows, cols, [=](int64_t r) {
    // With a causal mask, query row q sees keys 0..q.
    const int64_t visible = causal ? std::min(cols, r % rows_per + 1) : cols;
    SoftmaxRow(px + r * cols, py + r * cols, 0, visible, cols, scale);
  });
}

void CpuBackend::DoSoftmaxInSpans(const Tensor& x, float scale, bool causal,
                                  const Tensor& spans, const Tensor& y) {
  const int64_t seq = x.dim(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(seq, 1);
  const int64_t samples = spans.dim(0);
  // Score matrices per sample: the heads.
  const int64_t heads = rows / seq / samples;
  const float* px = F(x);
  float* py = F(y);
  const int64_t* ps = spans.data<int64_t>();
  ParallelForRows(rows, seq, [=](int64_t r) {
    const int64_t q = r % seq, sample = r / seq / heads;
    const int64_t* span = ps + (sample * seq + q) * 2;
    const int64_t hi = causal ? q + 1 : span[1];
    SoftmaxRow(px + r * seq, py + r * seq, span[0], hi, seq, scale);
  });
}

void CpuBackend::DoSoftmaxBackward(const Tensor& y, const Tensor& dy,
                                   float scale, const Tensor& dx) {
  const int64_t cols = y.dim(-1), rows = y.numel() / std::max<int64_t>(cols, 1);
  const float *py = F(y), *pdy = F(dy);
  float* pdx = F(dx);
  const int64_t body = cols / kLanes * kLanes;
  ParallelForRows(rows, cols, [=](int64_t r) {
    const float* yr = py + r * cols;
    const float* gr = pdy + r * cols;
    // sum(y * dy) of each product in fp32, accumulated in double.
    DoubleSum dot;
    for (int64_t c = 0; c < body; c += kLanes) {
      dot.Add(Load(yr + c) * Load(gr + c));
    }
    double tail = 0;
    for (int64_t c = body; c < cols; ++c) {
      tail += static_cast<double>(yr[c]) * gr[c];
    }
    const float d = static_cast<float>(dot.Total() + tail);
    float* out = pdx + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] = scale * yr[c] * (gr[c] - d);
  });
}

namespace {

// Moves between qkv [B, S, 3, H, D] and q/k/v [B, H, S, D]; `to_heads`
// chooses the direction.
void PermuteQkv(const Tensor& qkv, int64_t heads, const Tensor& q,
                const Tensor& k, const Tensor& v, bool to_heads) {
  const int64_t b = q.dim(0), s = q.dim(2), d = q.dim(3);
  float* pqkv = F(qkv);
  float* parts[3] = {F(q), F(k), F(v)};
  ParallelForRows(b * s, 3 * heads * d, [=](int64_t bs) {
    const int64_t bi = bs / s, si = bs % s;
    for (int p = 0; p < 3; ++p) {
      for (int64_t h = 0; h < heads; ++h) {
        float* packed = pqkv + ((bs * 3 + p) * heads + h) * d;
        float* split = parts[p] + ((bi * heads + h) * s + si) * d;
        for (int64_t i = 0; i < d; ++i) {
          if (to_heads) {
            split[i] = packed[i];
          } else {
            packed[i] = split[i];
          }
        }
      }
    }
  });
}

// Moves between x [B, H, S, D] and out [B, S, H*D].
void PermuteMerge(const Tensor& x, const Tensor& out, bool to_merged) {
  const int64_t b = x.dim(0), heads = x.dim(1), s = x.dim(2), d = x.dim(3);
  float *px = F(x), *po = F(out);
  ParallelForRows(b * s, heads * d, [=](int64_t bs) {
    const int64_t bi = bs / s, si = bs % s;
    for (int64_t h = 0; h < heads; ++h) {
      float* split = px + ((bi * heads + h) * s + si) * d;
      float* merged = po + (bs * heads + h) * d;
      for (int64_t i = 0; i < d; ++i) {
        if (to_merged) {
          merged[i] = split[i];
        } else {
          split[i] = merged[i];
        }
      }
    }
  });
}

}  // namespace

void CpuBackend::DoSplitHeads(const Tensor& qkv, int64_t heads, const Tensor& q,
                              const Tensor& k, const Tensor& v) {
  PermuteQkv(qkv, heads, q, k, v, /*to_heads=*/true);
}

void CpuBackend::DoSplitHeadsBackward(const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv, int64_t heads,
                                      const Tensor& dqkv) {
  PermuteQkv(dqkv, heads, dq, dk, dv, /*to_heads=*/false);
}

void CpuBackend::DoMergeHeads(const Tensor& x, const Tensor& out) {
  PermuteMerge(x, out, /*to_merged=*/true);
}

void CpuBackend::DoMergeHeadsBackward(const Tensor& dout, const Tensor& dx) {
  PermuteMerge(dx, dout, /*to_merged=*/false);
}

absl::Status CpuBackend::DoEmbeddingForward(const Tensor& ids,
                                            const Tensor& table,
                                            const Tensor& out) {
  const int64_t n = ids.numel(), vocab = table.dim(0), d = table.dim(1);
  const int64_t* pid = ids.data<int64_t>();
  if (const int64_t i = FirstOutOfRange(pid, n, vocab); i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", pid[i], " at position ", i,
                     " is outside the vocabulary [0, ", vocab, ")"));
  }
  const float* pt = F(table);
  float* po = F(out);
  ParallelForRows(n, d, [=](int64_t i) {
    const float* src = pt + pid[i] * d;
    float* dst = po + i * d;
    for (int64_t c = 0; c < d; ++c) dst[c] = src[c];
  });
  return absl::OkStatus();
}

void CpuBackend::DoEmbeddingBackward(const Tensor& ids, const Tensor& dy,
                                     const Tensor& dtable) {
  const int64_t n = ids.numel(), d = dtable.dim(1);
  const int64_t* pid = ids.data<int64_t>();
  const float* pdy = F(dy);
  float* pt = F(dtable);
  // Sequential over tokens: repeated ids write the same row, and a fixed
  // order keeps the sum deterministic.
  for (int64_t i = 0; i < n; ++i) {
    float* row = pt + pid[i] * d;
    const float* g = pdy + i * d;
    for (int64_t c = 0; c < d; ++c) row[c] += g[c];
  }
}

void CpuBackend::DoCastToBf16(const Tensor& x, const Tensor& y) {
  const float* px = F(x);
  uint16_t* py = static_cast<uint16_t*>(y.raw());
  ParallelFor(x.numel(), [=](int64_t i) {
    const float r = RoundToBf16(px[i]);
    uint32_t bits;
    std::memcpy(&bits, &r, sizeof(bits));
    py[i] = static_cast<uint16_t>(bits >> 16);
  });
}

void CpuBackend::DoCastFromBf16(const Tensor& x, const Tensor& y) {
  const uint16_t* px = static_cast<const uint16_t*>(x.raw());
  float* py = F(y);
  ParallelFor(x.numel(), [=](int64_t i) {
    const uint32_t bits = static_cast<uint32_t>(px[i]) << 16;
    std::memcpy(&py[i], &bits, sizeof(bits));
  });
}

absl::StatusOr<float> CpuBackend::DoMseLoss(const Tensor& y,
                                            const Tensor& target,
                                            float grad_scale,
                                            const Tensor& dy) {
  const int64_t n = y.numel();
  const float *py = F(y), *pt = F(target);
  float* pdy = F(dy);
  const float g = n > 0 ? grad_scale * 2.0f / static_cast<float>(n) : 0.0f;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float diff = py[i] - pt[i];
    sum += static_cast<double>(diff) * diff;
    pdy[i] = g * diff;
  }
  return n > 0 ? static_cast<float>(sum / n) : 0.0f;
}

absl::StatusOr<float> CpuBackend::DoCrossEntropyLoss(const Tensor& logits,
                                                     const Tensor& targets,
                                                     float grad_scale,
                                                     const Tensor& dlogits) {
  const int64_t vocab = logits.dim(-1);
  const int64_t n = logits.numel() / std::max<int64_t>(vocab, 1);
  const int64_t* pt = targets.data<int64_t>();
  int64_t counted = 0;
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; ++i) {
    if (pt[i] == kIgnoredTarget) continue;
    if (pt[i] < 0 || pt[i] >= vocab) bad = i;
    ++counted;
  }
  if (const int64_t i = bad; i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cross_entropy: target ", pt[i], " at position ", i,
                     " is outside [0, ", vocab, ")"));
  }
  const float* pl = F(logits);
  float* pd = F(dlogits);
  // The mean runs over the counted rows; ignored rows get a zero gradient.
  const float g = counted > 0 ? grad_scale / static_cast<float>(counted) : 0.0f;
  const int64_t body = vocab / kLanes * kLanes;
  double* row_loss = Scratch(n);
  ParallelForRows(n, vocab, [=](int64_t r) {
    const float* in = pl + r * vocab;
    float* out = pd + r * vocab;
    if (pt[r] == kIgnoredTarget) {
      row_loss[r] = 0.0;
      for (int64_t c = 0; c < vocab; ++c) out[c] = 0.0f;
      return;
    }
    const float max = ScaledMax(in, vocab, 1.0f);
    // One pass stores exp(x - max) and sums it; the second scales it into
    // the softmax. Exp's 1e-7 relative error is below fp32 logits' own.
    DoubleSum sum;
    for (int64_t c = 0; c < body; c += kLanes) {
      const Vf e = Exp(Load(in + c) - max);
      Store(out + c, e);
      sum.Add(e);
    }
    double tail = 0;
    for (int64_t c = body; c < vocab; ++c) {
      out[c] = static_cast<float>(std::exp(static_cast<double>(in[c] - max)));
      tail += out[c];
    }
    const double total = sum.Total() + tail;
    row_loss[r] = std::log(total) - (in[pt[r]] - max);
    const float scale = static_cast<float>(g / total);
    for (int64_t c = 0; c < vocab; ++c) out[c] *= scale;
    out[pt[r]] -= g;
  });
  double total = 0;
  for (int64_t r = 0; r < n; ++r) total += row_loss[r];
  return counted > 0 ? static_cast<float>(total / counted) : 0.0f;
}

void CpuBackend::DoSgdUpdate(const SgdParams& p, const Tensor& param,
                             const Tensor& grad, const Tensor& momentum) {
  float *w = F(param), *g = F(grad);
  float* buf = p.momentum != 0.0f ? F(momentum) : nullptr;
  ParallelFor(param.numel(), [=](int64_t i) {
    float d = g[i] + p.weight_decay * w[i];
    if (buf) {
      buf[i] =
          p.first_step ? d : p.momentum * buf[i] + (1.0f - p.dampening) * d;
      d = p.nesterov ? d + p.momentum * buf[i] : buf[i];
    }
    w[i] -= p.lr * d;
  });
}

void CpuBackend::DoAdamUpdate(const AdamParams& p, const Tensor& param,
                              const Tensor& grad, const Tensor& exp_avg,
                              const Tensor& exp_avg_sq) {
  float *w = F(param), *g = F(grad), *m = F(exp_avg), *v = F(exp_avg_sq);
  const double bias1 = 1.0 - std::pow(static_cast<double>(p.beta1), p.step);
  const double bias2 = 1.0 - std::pow(static_cast<double>(p.beta2), p.step);
  const float step_size = static_cast<float>(p.lr / bias1);
  const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  const float decay = 1.0f - p.lr * p.weight_decay;
  // The same operations, in the same order, as one element at a time, on
  // vectors: sqrt and division are correctly rounded either way, so the
  // result is bit for bit the scalar loop's.
  auto update = [=](int64_t i, int64_t n) {
    Vf wi = LoadPartial(w + i, n), gi = LoadPartial(g + i, n);
    if (p.decoupled_weight_decay) {
      wi *= decay;
    } else {
      gi += p.weight_decay * wi;
    }
    const Vf mi = p.beta1 * LoadPartial(m + i, n) + (1.0f - p.beta1) * gi;
    const Vf vi = p.beta2 * LoadPartial(v + i, n) + (1.0f - p.beta2) * gi * gi;
    const Vf denom = Sqrt(vi) / bias2_sqrt + p.eps;
    StorePartial(w + i, wi - step_size * mi / denom, n);
    StorePartial(m + i, mi, n);
    StorePartial(v + i, vi, n);
  };
  ForChunks(param.numel(), [=](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) update(i, kLanes);
    if (i < end) update(i, end - i);
  });
}

absl::StatusOr<double> CpuBackend::SumSquares(const Tensor& x) {
  // The gradient norm: the rank that finishes a pipelined step last sums
  // its squares before the all-reduce, on the step's critical path. A
  // float's square is exact in double; four independent 2-lane
  // accumulators keep each add from waiting on the one before (a single
  // running sum took 1 ms for a quarter-million gradients).
  const float* p = F(x);
  const int64_t n = x.numel();
  Vd acc[4] = {};
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const Vf a = Load(p + i), b = Load(p + i + kLanes);
    const Vd parts[4] = {
        __builtin_convertvector(__builtin_shufflevector(a, a, 0, 1), Vd),
        __builtin_convertvector(__builtin_shufflevector(a, a, 2, 3), Vd),
        __builtin_convertvector(__builtin_shufflevector(b, b, 0, 1), Vd),
        __builtin_convertvector(__builtin_shufflevector(b, b, 2, 3), Vd)};
    for (int k = 0; k < 4; ++k) acc[k] += parts[k] * parts[k];
  }
  const Vd total = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  double sum = total[0] + total[1];
  for (; i < n; ++i) sum += static_cast<double>(p[i]) * p[i];
  return sum;
}

}  // namespace conveyor::engine
