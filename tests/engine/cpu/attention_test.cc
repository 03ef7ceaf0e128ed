// Fused attention (Backend::Attention, AttentionBackward) on the CPU backend
// against a float64 reference of the materializing computation, elementwise
// within a first-order rounding-error bound derived for each output from the
// operands' magnitudes (never from what passed once;
// tests/engine/attention_reference.h), and the materializing backend path,
// the layers' before, within the same bounds.
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
#include "tests/engine/attention_reference.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using testing_util::Compute;
using testing_util::FromVector;
using testing_util::Ids;
using testing_util::Problem;
using testing_util::Random;
using testing_util::Reference;
using testing_util::ToVector;
using testing_util::WithinBound;

AttentionMask MaskOf(const Problem& p) {
  AttentionMask m{.causal = p.causal};
  if (!p.spans.empty()) m.spans = Ids({p.b, p.s, 2}, p.spans);
  return m;
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
  const AttentionMask mask = MaskOf(p);
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
  be.GemmStridedBatched(
      HeadGemm(b * g, false, true, r * s, s, d, dout, d, v, d, 0.0f, d_probs));
  const Tensor dv = *be.Empty({b, g, s, d}, DType::kF32);
  be.GemmStridedBatched(
      HeadGemm(b * g, true, false, s, d, r * s, probs, s, dout, d, 0.0f, dv));
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
