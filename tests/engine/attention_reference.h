// A float64 reference for fused attention (Backend::Attention and its
// backward) and, for each output, a first-order bound on the rounding error
// of a computation that rounds as the fused kernels do, derived from the
// operands' magnitudes: the CPU and CUDA tests compare against it.
#ifndef CONVEYOR_TESTS_ENGINE_ATTENTION_REFERENCE_H_
#define CONVEYOR_TESTS_ENGINE_ATTENTION_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine::testing_util {

struct Problem {
  int64_t b = 2, h = 4, g = 2, s = 150, d = 16;
  bool causal = true;
  std::vector<int64_t> spans;  // [b, s, 2] or empty.
  float scale = 0.25f;
  std::vector<float> q, k, v, dout;

  Problem(int64_t batch, int64_t heads, int64_t groups, int64_t seq,
          int64_t dim, bool causal_mask, uint32_t seed)
      : b(batch), h(heads), g(groups), s(seq), d(dim), causal(causal_mask) {
    scale = 1.0f / std::sqrt(static_cast<float>(d));
    q = Random(b * h * s * d, seed, 1.5f);
    k = Random(b * g * s * d, seed + 1, 1.5f);
    v = Random(b * g * s * d, seed + 2);
    dout = Random(b * h * s * d, seed + 3);
  }
  // Documents of the given lengths, repeated to fill each row.
  void Documents(const std::vector<int64_t>& lengths) {
    spans.assign(b * s * 2, 0);
    for (int64_t bi = 0; bi < b; ++bi) {
      int64_t first = 0, end = 0, n = bi;
      for (int64_t t = 0; t < s; ++t) {
        if (t >= end) {
          first = t;
          end = std::min(s, t + lengths[n++ % lengths.size()]);
        }
        spans[(bi * s + t) * 2] = first;
        spans[(bi * s + t) * 2 + 1] = end;
      }
    }
  }
  void Visible(int64_t bi, int64_t row, int64_t* lo, int64_t* hi) const {
    *lo = 0;
    *hi = s;
    if (!spans.empty()) {
      *lo = spans[(bi * s + row) * 2];
      *hi = spans[(bi * s + row) * 2 + 1];
    }
    if (causal) *hi = std::min(*hi, row + 1);
  }
};

// The exact (float64) results and, for each, the bound on how far a
// computation that rounds as the fused kernel does may be from them.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
  std::vector<double> out_bound, dq_bound, dk_bound, dv_bound;
};

// `w`: the unit roundoff of GEMM inputs (0 in fp32, 2^-8 when the backend
// rounds them to bf16); u: fp32's.
inline Reference Compute(const Problem& p, double w) {
  const double u = std::ldexp(1.0, -24);
  auto gamma = [&](int64_t n) { return n * u / (1 - n * u); };
  const int64_t b = p.b, h = p.h, g = p.g, s = p.s, d = p.d, r = h / g;
  // Relative error of a probability from its evaluation: exp (3e-7 < 6u),
  // the sum and its reciprocal, and one correction (exp and multiply) per
  // key block of the online softmax.
  const double rho = (10 + 3 * ((s + 63) / 64)) * u;
  Reference ref;
  ref.out.assign(b * h * s * d, 0);
  ref.out_bound.assign(b * h * s * d, 0);
  ref.lse.assign(b * h * s, 0);
  ref.dq.assign(b * h * s * d, 0);
  ref.dq_bound.assign(b * h * s * d, 0);
  ref.dk.assign(b * g * s * d, 0);
  ref.dk_bound.assign(b * g * s * d, 0);
  ref.dv.assign(b * g * s * d, 0);
  ref.dv_bound.assign(b * g * s * d, 0);
  std::vector<double> prob(s), err(s), dp(s), ds(s), ds_err(s);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi_ = 0; hi_ < h; ++hi_) {
      const int64_t gi = hi_ / r;
      const float* q = &p.q[((bi * h + hi_) * s) * d];
      const float* k = &p.k[((bi * g + gi) * s) * d];
      const float* v = &p.v[((bi * g + gi) * s) * d];
      const float* go = &p.dout[((bi * h + hi_) * s) * d];
      const int64_t row0 = (bi * h + hi_) * s;
      const int64_t kv0 = (bi * g + gi) * s;
      for (int64_t i = 0; i < s; ++i) {
        int64_t lo, end;
        p.Visible(bi, i, &lo, &end);
        if (lo >= end) {
          ref.lse[row0 + i] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = lo; j < end; ++j) {
          double dot = 0, abs = 0;
          for (int64_t c = 0; c < d; ++c) {
            dot += static_cast<double>(q[i * d + c]) * k[j * d + c];
            abs += std::fabs(static_cast<double>(q[i * d + c]) * k[j * d + c]);
          }
          prob[j] = p.scale * dot;
          // The score's error: rounded inputs, the d-term sum, the scale.
          err[j] = (2 * w + gamma(d + 1)) * p.scale * abs;
          max = std::max(max, prob[j]);
        }
        double sum = 0;
        for (int64_t j = lo; j < end; ++j) sum += std::exp(prob[j] - max);
        ref.lse[row0 + i] = max + std::log(sum);
        double mean_err = 0;
        for (int64_t j = lo; j < end; ++j) {
          prob[j] = std::exp(prob[j] - max) / sum;
          mean_err += prob[j] * err[j];
        }
        // |delta p_ij| <= p_ij (e_ij + sum_l p_il e_il + rho): the softmax's
        // first-order response to score errors, plus its own rounding.
        for (int64_t j = lo; j < end; ++j) {
          err[j] = prob[j] * (err[j] + mean_err + rho);
        }
        double delta = 0, delta_abs = 0, delta_from_out = 0;
        for (int64_t c = 0; c < d; ++c) {
          double o = 0, bound = 0;
          for (int64_t j = lo; j < end; ++j) {
            o += prob[j] * v[j * d + c];
            const double av = std::fabs(v[j * d + c]);
            bound += err[j] * av + (2 * w + gamma(end - lo) + u) * prob[j] * av;
          }
          ref.out[(row0 + i) * d + c] = o;
          ref.out_bound[(row0 + i) * d + c] = bound;
          delta += static_cast<double>(go[i * d + c]) * o;
          delta_abs += std::fabs(go[i * d + c] * o);
          // delta is computed from the computed output: its bound enters.
          delta_from_out += std::fabs(go[i * d + c]) * bound;
        }
        const double delta_err = delta_from_out + gamma(d + 1) * delta_abs;
        for (int64_t j = lo; j < end; ++j) {
          double dot = 0, abs = 0;
          for (int64_t c = 0; c < d; ++c) {
            dot += static_cast<double>(go[i * d + c]) * v[j * d + c];
            abs += std::fabs(static_cast<double>(go[i * d + c]) * v[j * d + c]);
          }
          dp[j] = dot;
          ds[j] = prob[j] * (dot - delta);
          const double dp_err = (2 * w + gamma(d)) * abs;
          ds_err[j] = err[j] * std::fabs(dot - delta) +
                      prob[j] * (dp_err + delta_err) +
                      (w + 2 * u) * std::fabs(ds[j]);
        }
        for (int64_t c = 0; c < d; ++c) {
          double dq = 0, bound = 0;
          for (int64_t j = lo; j < end; ++j) {
            dq += ds[j] * k[j * d + c];
            const double ak = std::fabs(k[j * d + c]);
            bound += ds_err[j] * ak +
                     (w + gamma(end - lo + 1)) * std::fabs(ds[j]) * ak;
          }
          ref.dq[(row0 + i) * d + c] = p.scale * dq;
          ref.dq_bound[(row0 + i) * d + c] = p.scale * bound;
        }
        for (int64_t j = lo; j < end; ++j) {
          for (int64_t c = 0; c < d; ++c) {
            const int64_t at = (kv0 + j) * d + c;
            const double aq = std::fabs(q[i * d + c]);
            const double ag = std::fabs(go[i * d + c]);
            ref.dk[at] += p.scale * ds[j] * q[i * d + c];
            ref.dk_bound[at] +=
                p.scale * (ds_err[j] * aq +
                           (w + gamma(r * s + 1)) * std::fabs(ds[j]) * aq);
            ref.dv[at] += prob[j] * go[i * d + c];
            ref.dv_bound[at] +=
                (err[j] + w * prob[j]) * ag + (w + gamma(r * s)) * prob[j] * ag;
          }
        }
      }
    }
  }
  return ref;
}

// |got - want| <= 2 * bound elementwise (2: the second-order terms the
// first-order bound leaves out), reporting the first failure.
inline ::testing::AssertionResult WithinBound(
    const char* what, const std::vector<float>& got,
    const std::vector<double>& want, const std::vector<double>& bound) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << what << ": sizes differ";
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(got[i] - want[i]);
    if (!(diff <= 2 * bound[i])) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "] = " << got[i] << ", exact " << want[i]
             << ": off by " << diff << ", bound " << 2 * bound[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace conveyor::engine::testing_util

#endif  // CONVEYOR_TESTS_ENGINE_ATTENTION_REFERENCE_H_
