// Fused attention (Backend::Attention, AttentionBackward) on the CPU backend
// against a float64 reference of the materializing computation, elementwise
// within a first-order rounding-error bound derived for each output from the
// operands' magnitudes (never from what passed once), and against the
// materializing backend path itself within the same bounds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/parallel.h"
#include "engine/layers/head_gemm.h"
#include "engine/precision.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using testing_util::FromVector;
using testing_util::Ids;
using testing_util::Random;
using testing_util::ToVector;

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
  AttentionMask Mask() const {
    AttentionMask m{.causal = causal};
    if (!spans.empty()) m.spans = Ids({b, s, 2}, spans);
    return m;
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
Reference Compute(const Problem& p, double w) {
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
            bound += err[j] * av +
                     (2 * w + gamma(end - lo) + u) * prob[j] * av;
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
            ref.dv_bound[at] += (err[j] + w * prob[j]) * ag +
                                (w + gamma(r * s)) * prob[j] * ag;
          }
        }
      }
    }
  }
  return ref;
}

// |got - want| <= 2 * bound elementwise (2: the second-order terms the
// first-order bound leaves out), reporting the first failure.
::testing::AssertionResult WithinBound(const char* what,
                                       const std::vector<float>& got,
                                       const std::vector<double>& want,
                                       const std::vector<double>& bound) {
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

struct Fused {
  std::vector<float> out, lse, dq, dk, dv;
};

Fused RunFused(Backend& be, const Problem& p) {
  const Tensor q = FromVector({p.b, p.h, p.s, p.d}, p.q);
  const Tensor k = FromVector({p.b, p.g, p.s, p.d}, p.k);
  const Tensor v = FromVector({p.b, p.g, p.s, p.d}, p.v);
  const Tensor dout = FromVector({p.b, p.h, p.s, p.d}, p.dout);
  const Tensor out = *be.Empty(q.shape(), DType::kF32);
  const Tensor lse = *be.Empty({p.b, p.h, p.s}, DType::kF32);
  const Tensor dq = *be.Empty(q.shape(), DType::kF32);
  const Tensor dk = *be.Empty(k.shape(), DType::kF32);
  const Tensor dv = *be.Empty(k.shape(), DType::kF32);
  const AttentionMask mask = p.Mask();
  be.Attention(q, k, v, p.scale, mask, out, lse);
  be.AttentionBackward(q, k, v, out, lse, dout, p.scale, mask, dq, dk, dv);
  return {ToVector(out), ToVector(lse), ToVector(dq), ToVector(dk),
          ToVector(dv)};
}

// The materializing path the layers used before: scores, Softmax or
// SoftmaxInSpans, and GEMMs, with the backward through SoftmaxBackward.
Fused RunMaterializing(Backend& be, const Problem& p) {
  const int64_t b = p.b, h = p.h, g = p.g, s = p.s, d = p.d, r = h / g;
  const Tensor q = FromVector({b, h, s, d}, p.q);
  const Tensor k = FromVector({b, g, s, d}, p.k);
  const Tensor v = FromVector({b, g, s, d}, p.v);
  const Tensor dout = FromVector({b, h, s, d}, p.dout);
  const Tensor scores = *be.Empty({b, h, s, s}, DType::kF32);
  const Tensor probs = *be.Empty({b, h, s, s}, DType::kF32);
  be.GemmStridedBatched(
      HeadGemm(b * g, false, true, r * s, s, d, q, d, k, d, 0.0f, scores));
  if (p.spans.empty()) {
    be.Softmax(scores, p.scale, p.causal, probs);
  } else {
    be.SoftmaxInSpans(scores, p.scale, p.causal, Ids({b, s, 2}, p.spans),
                      probs);
  }
  const Tensor out = *be.Empty({b, h, s, d}, DType::kF32);
  be.GemmStridedBatched(
      HeadGemm(b * g, false, false, r * s, d, s, probs, s, v, d, 0.0f, out));
  const Tensor d_probs = *be.Empty({b, h, s, s}, DType::kF32);
  be.GemmStridedBatched(HeadGemm(b * g, false, true, r * s, s, d, dout, d, v,
                                 d, 0.0f, d_probs));
  const Tensor dv = *be.Empty({b, g, s, d}, DType::kF32);
  be.GemmStridedBatched(HeadGemm(b * g, true, false, s, d, r * s, probs, s,
                                 dout, d, 0.0f, dv));
  const Tensor d_scores = *be.Empty({b, h, s, s}, DType::kF32);
  be.SoftmaxBackward(probs, d_probs, p.scale, d_scores);
  const Tensor dq = *be.Empty({b, h, s, d}, DType::kF32);
  be.GemmStridedBatched(
      HeadGemm(b * g, false, false, r * s, d, s, d_scores, s, k, d, 0.0f, dq));
  const Tensor dk = *be.Empty({b, g, s, d}, DType::kF32);
  be.GemmStridedBatched(
      HeadGemm(b * g, true, false, s, d, r * s, d_scores, s, q, d, 0.0f, dk));
  return {ToVector(out), {}, ToVector(dq), ToVector(dk), ToVector(dv)};
}

void ExpectWithinBounds(const Fused& got, const Reference& ref) {
  EXPECT_TRUE(WithinBound("out", got.out, ref.out, ref.out_bound));
  EXPECT_TRUE(WithinBound("dq", got.dq, ref.dq, ref.dq_bound));
  EXPECT_TRUE(WithinBound("dk", got.dk, ref.dk, ref.dk_bound));
  EXPECT_TRUE(WithinBound("dv", got.dv, ref.dv, ref.dv_bound));
}

void ExpectLse(const Fused& got, const Reference& ref) {
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      EXPECT_TRUE(std::isinf(got.lse[i]) && got.lse[i] < 0) << i;
      continue;
    }
    // lse's error is the scores' (a few hundred u of |s| here), far below.
    EXPECT_NEAR(got.lse[i], ref.lse[i], 1e-4 * (1 + std::fabs(ref.lse[i])))
        << i;
  }
}

struct Case {
  const char* name;
  int64_t b, h, g, s, d;
  bool causal;
  std::vector<int64_t> documents;  // lengths; empty: no document mask.
};

class FusedAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(FusedAttentionTest, Fp32MatchesTheExactResultWithinItsBound) {
  const Case& c = GetParam();
  Problem p(c.b, c.h, c.g, c.s, c.d, c.causal, 7);
  if (!c.documents.empty()) p.Documents(c.documents);
  const Reference ref = Compute(p, 0.0);
  const Fused fused = RunFused(*CpuBackend::Get(), p);
  ExpectWithinBounds(fused, ref);
  ExpectLse(fused, ref);
  // The materializing path is within the same bounds: the two agree.
  ExpectWithinBounds(RunMaterializing(*CpuBackend::Get(), p), ref);
}

TEST_P(FusedAttentionTest, Bf16MatchesTheExactResultWithinItsBound) {
  const Case& c = GetParam();
  Problem p(c.b, c.h, c.g, c.s, c.d, c.causal, 11);
  if (!c.documents.empty()) p.Documents(c.documents);
  const Reference ref = Compute(p, std::ldexp(1.0, -8));
  Backend& bf16 = *CpuBackend::Get(Precision::kBf16);
  ExpectWithinBounds(RunFused(bf16, p), ref);
  ExpectWithinBounds(RunMaterializing(bf16, p), ref);
  // And bf16 really rounds: the fused output is not the fp32 one.
  EXPECT_NE(RunFused(bf16, p).out, RunFused(*CpuBackend::Get(), p).out);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedAttentionTest,
    ::testing::Values(
        // Several key blocks with a partial last one; GQA 2:1.
        Case{"causal_gqa", 2, 4, 2, 150, 16, true, {}},
        Case{"full_gqa", 2, 4, 2, 150, 16, false, {}},
        // Multi-head (G = H), one partial block, a wide head.
        Case{"causal_mha", 1, 2, 2, 40, 64, true, {}},
        // Grouped 4:1 with documents crossing the block boundaries.
        Case{"documents_causal", 2, 4, 1, 140, 8, true, {50, 3, 90, 1}},
        Case{"documents_full", 2, 4, 1, 140, 8, false, {50, 3, 90, 1}}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(info.param.name);
    });

// A sample's results do not depend on the rest of its batch, nor on the
// thread count: replicas and tensor-parallel ranks rely on this (bitwise).
TEST(FusedAttentionInvarianceTest, ASampleAloneEqualsItInABatchAndAnyThreads) {
  Problem batch(3, 4, 2, 130, 32, true, 3);
  SetCpuThreads(2);
  const Fused whole = RunFused(*CpuBackend::Get(), batch);
  SetCpuThreads(1);
  const Fused serial = RunFused(*CpuBackend::Get(), batch);
  SetCpuThreads(0);
  EXPECT_EQ(whole.out, serial.out);
  EXPECT_EQ(whole.dq, serial.dq);
  EXPECT_EQ(whole.dk, serial.dk);
  EXPECT_EQ(whole.dv, serial.dv);

  Problem one(1, 4, 2, 130, 32, true, 99);
  auto slice = [](const std::vector<float>& x, int64_t per) {
    return std::vector<float>(x.begin() + per, x.begin() + 2 * per);
  };
  const int64_t q_per = 4 * 130 * 32, kv_per = 2 * 130 * 32;
  one.q = slice(batch.q, q_per);
  one.k = slice(batch.k, kv_per);
  one.v = slice(batch.v, kv_per);
  one.dout = slice(batch.dout, q_per);
  const Fused alone = RunFused(*CpuBackend::Get(), one);
  EXPECT_EQ(alone.out, slice(whole.out, q_per));
  EXPECT_EQ(alone.lse, slice(whole.lse, 4 * 130));
  EXPECT_EQ(alone.dq, slice(whole.dq, q_per));
  EXPECT_EQ(alone.dk, slice(whole.dk, kv_per));
  EXPECT_EQ(alone.dv, slice(whole.dv, kv_per));
}

// A query whose document mask leaves it no key (a span that excludes it)
// gets zeros and lse -inf, and contributes no gradient: no NaN anywhere.
TEST(FusedAttentionMaskTest, ARowThatSeesNoKeyIsZeroNotNaN) {
  Problem p(1, 2, 1, 70, 8, /*causal=*/false, 5);
  p.Documents({70});
  for (int64_t t : {0, 65, 69}) {  // Empty ranges.
    p.spans[t * 2] = 10;
    p.spans[t * 2 + 1] = 10;
  }
  const Fused fused = RunFused(*CpuBackend::Get(), p);
  const Reference ref = Compute(p, 0.0);
  ExpectWithinBounds(fused, ref);
  ExpectLse(fused, ref);
  for (int64_t head = 0; head < 2; ++head) {
    for (int64_t t : {0, 65, 69}) {
      for (int64_t c = 0; c < 8; ++c) {
        EXPECT_EQ(fused.out[((head * 70) + t) * 8 + c], 0.0f);
        EXPECT_EQ(fused.dq[((head * 70) + t) * 8 + c], 0.0f);
      }
    }
  }
}

}  // namespace
}  // namespace conveyor::engine
