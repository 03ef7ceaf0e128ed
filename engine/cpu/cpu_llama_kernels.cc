// The Llama-family kernels of the CPU backend: RMS normalization, the SwiGLU
// gate and rotary position embedding. Reductions accumulate in double, as in
// cpu_nn_kernels.cc; the rotary angles are computed in float the way HF's
// LlamaRotaryEmbedding computes them (from the inverse frequencies of
// engine/rope.h), so that both see the same rotation.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/parallel.h"

namespace conveyor::engine {
namespace {

float* F(const Tensor& t) { return t.data<float>(); }

int64_t RowsOf(const Tensor& x) {
  return x.numel() / std::max<int64_t>(x.dim(-1), 1);
}

float Sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

void CpuBackend::DoRmsNorm(const Tensor& x, const Tensor& weight, float eps,
                           const Tensor& y, const Tensor& rstd) {
  const int64_t cols = x.dim(-1), rows = RowsOf(x);
  const float *px = F(x), *pw = F(weight);
  float *py = F(y), *pr = F(rstd);
  ParallelForRows(rows, cols, [=](int64_t r) {
    const float* row = px + r * cols;
    double squares = 0;
    for (int64_t c = 0; c < cols; ++c) squares += double{row[c]} * row[c];
    const float inv = static_cast<float>(
        1.0 / std::sqrt(squares / static_cast<double>(cols) + eps));
    pr[r] = inv;
    float* out = py + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] = pw[c] * (row[c] * inv);
  });
}

void CpuBackend::DoRmsNormBackwardInput(const Tensor& x, const Tensor& weight,
                                        const Tensor& rstd, const Tensor& dy,
                                        const Tensor& dx) {
  const int64_t cols = x.dim(-1), rows = RowsOf(x);
  const float *px = F(x), *pw = F(weight), *pr = F(rstd), *pdy = F(dy);
  float* pdx = F(dx);
  ParallelForRows(rows, cols, [=](int64_t r) {
    const float* row = px + r * cols;
    const float* g = pdy + r * cols;
    const float inv = pr[r];
    // With xhat = x * rstd and g = dy * weight:
    // dx = rstd * (g - xhat * mean(g * xhat)).
    double sum_gx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      sum_gx += double{g[c] * pw[c]} * (row[c] * inv);
    }
    const float mean_gx = static_cast<float>(sum_gx / cols);
    float* out = pdx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      out[c] = inv * (g[c] * pw[c] - row[c] * inv * mean_gx);
    }
  });
}

void CpuBackend::DoRmsNormBackwardWeight(const Tensor& x, const Tensor& rstd,
                                         const Tensor& dy,
                                         const Tensor& dweight) {
  const int64_t cols = x.dim(-1), rows = RowsOf(x);
  const float *px = F(x), *pr = F(rstd), *pdy = F(dy);
  float* pdw = F(dweight);
  ParallelForRows(cols, rows, [=](int64_t c) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      sum += double{pdy[r * cols + c]} * (px[r * cols + c] * pr[r]);
    }
    pdw[c] += static_cast<float>(sum);
  });
}

void CpuBackend::DoSiluMul(const Tensor& gate, const Tensor& up,
                           const Tensor& y) {
  const float *pg = F(gate), *pu = F(up);
  float* py = F(y);
  ParallelFor(gate.numel(), [=](int64_t i) {
    const float g = pg[i];
    py[i] = g * Sigmoid(g) * pu[i];
  });
}

void CpuBackend::DoSiluMulBackward(const Tensor& gate, const Tensor& up,
                                   const Tensor& dy, const Tensor& dgate,
                                   const Tensor& dup) {
  const float *pg = F(gate), *pu = F(up), *pdy = F(dy);
  float *pdg = F(dgate), *pdu = F(dup);
  ParallelFor(gate.numel(), [=](int64_t i) {
    const float g = pg[i], s = Sigmoid(g);
    pdu[i] = pdy[i] * g * s;
    // silu'(g) = s + g s (1 - s).
    pdg[i] = pdy[i] * pu[i] * s * (1.0f + g * (1.0f - s));
  });
}

void CpuBackend::DoRope(const Tensor& x, const RopeFrequencies& freqs,
                        bool inverse, const Tensor& y, const Tensor& positions,
                        int64_t first_position) {
  const int64_t dim = x.dim(-1), half = dim / 2, seq = x.dim(-2);
  const int64_t rows = x.numel() / std::max<int64_t>(dim, 1);
  const int64_t batch = x.rank() >= 3 ? x.dim(0) : 1;
  if (rows == 0 || batch == 0) return;
  const int64_t rows_per_batch = rows / batch;
  // cos and sin per (position, frequency), as HF builds them: the angle is
  // float(pos) * inv_freq, and both are scaled by the attention factor.
  // One table row per sequence index, or per (batch, index) with explicit
  // positions: heads share them either way.
  const int64_t* pos =
      positions.defined() ? positions.data<int64_t>() : nullptr;
  const int64_t table_rows = pos != nullptr ? batch * seq : seq;
  const float* inv_freq = freqs.inv_freq.data<float>();
  const float scale = freqs.attention_factor;
  std::vector<float> cos(table_rows * half), sin(table_rows * half);
  float *pc = cos.data(), *ps = sin.data();
  // A cos and a sin cost tens of element operations each.
  ParallelForRows(table_rows, 32 * half, [=](int64_t t) {
    const int64_t p = pos != nullptr ? pos[t] : first_position + t;
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      const float c = std::cos(angle) * scale, s = std::sin(angle) * scale;
      pc[t * half + i] = c;
      ps[t * half + i] = inverse ? -s : s;
    }
  });
  const float* px = F(x);
  float* py = F(y);
  ParallelForRows(rows, dim, [=](int64_t r) {
    const float* in = px + r * dim;
    float* out = py + r * dim;
    const int64_t t =
        (pos != nullptr ? (r / rows_per_batch) * seq : 0) + r % seq;
    const float* c = pc + t * half;
    const float* s = ps + t * half;
    for (int64_t i = 0; i < half; ++i) {
      // Read both halves before writing: y may alias x.
      const float a = in[i], b = in[i + half];
      out[i] = a * c[i] - b * s[i];
      out[i + half] = b * c[i] + a * s[i];
    }
  });
}

}  // namespace conveyor::engine
