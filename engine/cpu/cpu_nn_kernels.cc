// Normalization, attention, embedding, loss and optimizer kernels of the CPU
// backend. Reductions accumulate in double so results do not depend on the
// thread count and stay close to a float64 reference.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/parallel.h"

namespace conveyor::engine {
namespace {

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
  ParallelForRows(rows, cols, [=](int64_t r) {
    const float* row = px + r * cols;
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += row[c];
    const double mu = sum / cols;
    double var = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double d = row[c] - mu;
      var += d * d;
    }
    var /= cols;
    const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
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
    double sum_g = 0, sum_gx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double dxhat = pg ? g[c] * pg[c] : g[c];
      sum_g += dxhat;
      sum_gx += dxhat * (row[c] - mu) * inv;
    }
    const float mean_g = static_cast<float>(sum_g / cols);
    const float mean_gx = static_cast<float>(sum_gx / cols);
    float* out = pdx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float dxhat = pg ? g[c] * pg[c] : g[c];
      const float xhat = (row[c] - mu) * inv;
      out[c] = inv * (dxhat - mean_g - xhat * mean_gx);
    }
  });
}

void CpuBackend::DoLayerNormBackwardWeight(const Tensor& x, const Tensor& mean,
                                           const Tensor& rstd, const Tensor& dy,
                                           const Tensor& dgamma,
                                           const Tensor& dbeta) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  const float *px = F(x), *pm = F(mean), *pr = F(rstd), *pdy = F(dy);
  float *pdg = F(dgamma), *pdb = F(dbeta);
  ParallelForRows(cols, rows, [=](int64_t c) {
    double sg = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float g = pdy[r * cols + c];
      sg += g * (px[r * cols + c] - pm[r]) * pr[r];
      sb += g;
    }
    pdg[c] += static_cast<float>(sg);
    pdb[c] += static_cast<float>(sb);
  });
}

void CpuBackend::DoSoftmax(const Tensor& x, float scale, bool causal,
                           const Tensor& y) {
  const int64_t cols = x.dim(-1);
  const int64_t rows_per = x.rank() >= 2 ? x.dim(-2) : 1;
  const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
  const float* px = F(x);
  float* py = F(y);
  ParallelForRows(rows, cols, [=](int64_t r) {
    const float* in = px + r * cols;
    float* out = py + r * cols;
    // With a causal mask, query row q sees keys 0..q.
    const int64_t visible = causal ? std::min(cols, r % rows_per + 1) : cols;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < visible; ++c) max = std::max(max, scale * in[c]);
    double sum = 0;
    for (int64_t c = 0; c < visible; ++c) {
      out[c] = std::exp(scale * in[c] - max);
      sum += out[c];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t c = 0; c < visible; ++c) out[c] *= inv;
    for (int64_t c = visible; c < cols; ++c) out[c] = 0.0f;
  });
}

void CpuBackend::DoSoftmaxBackward(const Tensor& y, const Tensor& dy,
                                   float scale, const Tensor& dx) {
  const int64_t cols = y.dim(-1), rows = y.numel() / std::max<int64_t>(cols, 1);
  const float *py = F(y), *pdy = F(dy);
  float* pdx = F(dx);
  ParallelForRows(rows, cols, [=](int64_t r) {
    const float* yr = py + r * cols;
    const float* gr = pdy + r * cols;
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c)
      dot += static_cast<double>(yr[c]) * gr[c];
    float* out = pdx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      out[c] = scale * yr[c] * (gr[c] - static_cast<float>(dot));
    }
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
  if (const int64_t i = FirstOutOfRange(pt, n, vocab); i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cross_entropy: target ", pt[i], " at position ", i,
                     " is outside [0, ", vocab, ")"));
  }
  const float* pl = F(logits);
  float* pd = F(dlogits);
  const float g = n > 0 ? grad_scale / static_cast<float>(n) : 0.0f;
  std::vector<double> row_loss(n);
  ParallelForRows(n, vocab, [&](int64_t r) {
    const float* in = pl + r * vocab;
    float* out = pd + r * vocab;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < vocab; ++c) max = std::max(max, in[c]);
    double sum = 0;
    for (int64_t c = 0; c < vocab; ++c)
      sum += std::exp(static_cast<double>(in[c] - max));
    const double log_sum = std::log(sum);
    row_loss[r] = log_sum - (in[pt[r]] - max);
    for (int64_t c = 0; c < vocab; ++c) {
      out[c] = g * static_cast<float>(std::exp(in[c] - max - log_sum));
    }
    out[pt[r]] -= g;
  });
  double total = 0;
  for (double l : row_loss) total += l;
  return n > 0 ? static_cast<float>(total / n) : 0.0f;
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
  ParallelFor(param.numel(), [=](int64_t i) {
    float gi = g[i];
    if (p.decoupled_weight_decay) {
      w[i] *= 1.0f - p.lr * p.weight_decay;
    } else {
      gi += p.weight_decay * w[i];
    }
    m[i] = p.beta1 * m[i] + (1.0f - p.beta1) * gi;
    v[i] = p.beta2 * v[i] + (1.0f - p.beta2) * gi * gi;
    const float denom = std::sqrt(v[i]) / bias2_sqrt + p.eps;
    w[i] -= step_size * m[i] / denom;
  });
}

absl::StatusOr<double> CpuBackend::SumSquares(const Tensor& x) {
  const float* p = F(x);
  double sum = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    sum += static_cast<double>(p[i]) * p[i];
  return sum;
}

}  // namespace conveyor::engine
