#include "engine/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/boundary_precision.h"
#include "engine/cpu/internal/vector_math.h"
#include "engine/cpu/parallel.h"
#include "engine/precision.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::AllClose;
using testing_util::FromVector;
using testing_util::Ids;
using testing_util::Random;
using testing_util::RandomTensor;
using testing_util::ToVector;
using testing_util::ZerosLike;

CpuBackend* B() { return CpuBackend::Get(); }

// Naive row-major reference: C = alpha op(A) op(B) + beta C, in double.
std::vector<float> NaiveGemm(bool ta, bool tb, int m, int n, int k, float alpha,
                             const std::vector<float>& a,
                             const std::vector<float>& b, float beta,
                             std::vector<float> c) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      c[i * n + j] = static_cast<float>(alpha * s + beta * c[i * n + j]);
    }
  }
  return c;
}

// The channels send a host-resident backend's tensors in place, with no
// staging copy: both precisions' CPU backends are.
TEST(CpuBackendTest, IsHostResident) {
  EXPECT_TRUE(CpuBackend::Get()->host_resident());
  EXPECT_TRUE(CpuBackend::Get(Precision::kBf16)->host_resident());
}

// The Backend's fronts check shapes for every backend: checks the CUDA
// backend made on its own now hold on the CPU too, where a mismatch used to
// read or write out of bounds.
TEST(CpuBackendDeathTest, TheFrontsRefuseMismatchedShapes) {
  CpuBackend* cpu = CpuBackend::Get();
  const Tensor q = *cpu->Zeros({1, 2, 3, 4});
  const Tensor flat = *cpu->Zeros({24});
  const Tensor qkv = *cpu->Zeros({72});
  EXPECT_DEATH(cpu->SplitHeads(qkv, 2, flat, flat, flat),
               "split-heads shapes disagree");
  EXPECT_DEATH(cpu->SplitHeads(qkv, 3, q, q, q), "split-heads shapes disagree");
  EXPECT_DEATH(cpu->MergeHeads(flat, q), "merge-heads shapes disagree");
  const Tensor x = *cpu->Zeros({2, 4});
  const Tensor stats = *cpu->Zeros({2});
  const Tensor wrong = *cpu->Zeros({3});
  EXPECT_DEATH(cpu->LayerNorm(x, wrong, Tensor(), 1e-5f, x, stats, stats),
               "layernorm weight has the wrong size");
  EXPECT_DEATH(cpu->Add(x, wrong, x), "add operands differ in size");
  EXPECT_DEATH(cpu->Gemm(false, false, 1.0f, x, x, 0.0f, x),
               "gemm inner dimensions differ");
  const Tensor f32_ids = *cpu->Zeros({2});
  EXPECT_DEATH((void)cpu->EmbeddingForward(f32_ids, x, x),
               "embedding takes i64 ids");
}

// Rope against its closed form in double: y = m (a cos - b sin, b cos +
// a sin) for the pair (a, b) = (x[i], x[i + half]) at angle pos * f[i].
std::vector<double> RopeReference(const std::vector<float>& x, int64_t batch,
                                  int64_t middle, int64_t seq, int64_t dim,
                                  const std::vector<float>& inv_freq,
                                  double scale,
                                  const std::vector<int64_t>& positions,
                                  bool transpose) {
  const int64_t half = dim / 2;
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t m = 0; m < middle; ++m) {
      for (int64_t s = 0; s < seq; ++s) {
        const int64_t row = (b * middle + m) * seq + s;
        const double pos = static_cast<double>(positions[b * seq + s]);
        for (int64_t i = 0; i < half; ++i) {
          const double angle = pos * inv_freq[i];
          const double c = scale * std::cos(angle);
          const double sn = (transpose ? -scale : scale) * std::sin(angle);
          const double a = x[row * dim + i], bb = x[row * dim + i + half];
          y[row * dim + i] = a * c - bb * sn;
          y[row * dim + i + half] = bb * c + a * sn;
        }
      }
    }
  }
  return y;
}

TEST(CpuBackendTest, RopeTurnsEachPairByItsPositionAndFrequency) {
  // [batch 2, heads 3, seq 4, head_dim 6]; per-batch positions restart
  // (packed documents) and run out of order; heads share them.
  const int64_t batch = 2, heads = 3, seq = 4, dim = 6;
  const std::vector<float> inv_freq = {1.0f, 0.3f, 0.05f};
  const std::vector<int64_t> positions = {0, 1, 0, 1, 5, 2, 7, 3};
  const RopeFrequencies freqs{.inv_freq = FromVector({3}, inv_freq),
                              .attention_factor = 0.8f};
  const Tensor x = RandomTensor({batch, heads, seq, dim}, 41);
  const std::vector<float> xv = ToVector(x);
  for (const bool transpose : {false, true}) {
    Tensor y = ZerosLike(x);
    B()->Rope(x, freqs, transpose, y, Ids({batch, seq}, positions));
    const std::vector<double> want = RopeReference(
        xv, batch, heads, seq, dim, inv_freq, 0.8, positions, transpose);
    const std::vector<float> got = ToVector(y);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-6) << i << " transpose " << transpose;
    }
  }
  // Without positions: first_position + the index along seq, the same as
  // positions that say so.
  Tensor from_first = ZerosLike(x), explicit_positions = ZerosLike(x);
  B()->Rope(x, freqs, false, from_first, Tensor(), /*first_position=*/3);
  B()->Rope(x, freqs, false, explicit_positions,
            Ids({batch, seq}, {3, 4, 5, 6, 3, 4, 5, 6}));
  EXPECT_EQ(ToVector(from_first), ToVector(explicit_positions));
  // Rank 2 is one batch; in place.
  Tensor rows =
      FromVector({seq, dim}, std::vector<float>(xv.begin(), xv.begin() + 24));
  const std::vector<double> want = RopeReference(
      ToVector(rows), 1, 1, seq, dim, inv_freq, 0.8, {5, 2, 7, 3}, false);
  B()->Rope(rows, freqs, false, rows, Ids({1, seq}, {5, 2, 7, 3}));
  const std::vector<float> got = ToVector(rows);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6);
}

TEST(CpuBackendTest, RopeTransposeIsTheAdjoint) {
  // <R x, y> = <x, R^T y> with the attention factor (R is m times a
  // rotation): what the backward relies on.
  const Tensor x = RandomTensor({2, 2, 5, 8}, 42);
  const Tensor y = RandomTensor({2, 2, 5, 8}, 43);
  const RopeFrequencies freqs{
      .inv_freq = FromVector({4}, {0.9f, 0.2f, 0.04f, 0.01f}),
      .attention_factor = 1.3f};
  const Tensor positions = Ids({2, 5}, {0, 1, 2, 0, 1, 9, 8, 0, 1, 2});
  Tensor rx = ZerosLike(x), rty = ZerosLike(y);
  B()->Rope(x, freqs, false, rx, positions);
  B()->Rope(y, freqs, true, rty, positions);
  double lhs = 0, rhs = 0;
  const std::vector<float> xv = ToVector(x), yv = ToVector(y),
                           rxv = ToVector(rx), rtyv = ToVector(rty);
  for (size_t i = 0; i < xv.size(); ++i) {
    lhs += double{rxv[i]} * yv[i];
    rhs += double{xv[i]} * rtyv[i];
  }
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::abs(lhs));
}

TEST(CpuBackendDeathTest, RopeRefusesBadFrequenciesAndPositions) {
  CpuBackend* cpu = CpuBackend::Get();
  const Tensor x = *cpu->Zeros({2, 3, 4});
  const RopeFrequencies freqs{.inv_freq = *cpu->Zeros({2})};
  EXPECT_DEATH(cpu->Rope(x, {.inv_freq = *cpu->Zeros({3})}, false, x),
               "head_dim / 2 f32 inverse frequencies");
  EXPECT_DEATH(cpu->Rope(x, freqs, false, x, Ids({2, 2}, {0, 1, 2, 3})),
               "rope positions must be i64 \\[batch, seq\\]");
  EXPECT_DEATH(cpu->Rope(x, freqs, false, x, *cpu->Zeros({2, 3})),
               "rope positions must be i64");
  EXPECT_DEATH(
      cpu->Rope(x, freqs, false, x, Ids({2, 3}, {0, 1, 2, 0, 1, 2}), 1),
      "rope takes positions or a first position, not both");
}

TEST(CpuBackendTest, GemmMatchesNaiveForEveryTransposeAndBeta) {
  const int m = 5, n = 7, k = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = Random(m * k, 1), b = Random(k * n, 2), c = Random(m * n, 3);
      Tensor ta_t = FromVector(ta ? Shape{k, m} : Shape{m, k}, a);
      Tensor tb_t = FromVector(tb ? Shape{n, k} : Shape{k, n}, b);
      Tensor tc = FromVector({m, n}, c);
      B()->Gemm(ta, tb, 0.5f, ta_t, tb_t, 2.0f, tc);
      EXPECT_TRUE(AllClose(ToVector(tc),
                           NaiveGemm(ta, tb, m, n, k, 0.5f, a, b, 2.0f, c),
                           1e-5, 1e-5))
          << "ta=" << ta << " tb=" << tb;
    }
  }
}

TEST(CpuBackendTest, StridedBatchedGemmRunsEachBatch) {
  const int batch = 3, m = 2, n = 4, k = 5;
  auto a = Random(batch * m * k, 4), b = Random(batch * k * n, 5);
  std::vector<float> c(batch * m * n, 0.0f);
  GemmBatch g;
  g.batch = batch;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a.data();
  g.lda = k;
  g.stride_a = m * k;
  g.b = b.data();
  g.ldb = n;
  g.stride_b = k * n;
  g.c = c.data();
  g.ldc = n;
  g.stride_c = m * n;
  B()->GemmStridedBatched(g);
  for (int i = 0; i < batch; ++i) {
    std::vector<float> ai(a.begin() + i * m * k, a.begin() + (i + 1) * m * k);
    std::vector<float> bi(b.begin() + i * k * n, b.begin() + (i + 1) * k * n);
    std::vector<float> ci(c.begin() + i * m * n, c.begin() + (i + 1) * m * n);
    EXPECT_TRUE(AllClose(ci,
                         NaiveGemm(false, false, m, n, k, 1, ai, bi, 0,
                                   std::vector<float>(m * n)),
                         1e-5, 1e-5));
  }
}

TEST(PrecisionTest, RoundToBf16RoundsToNearestEven) {
  EXPECT_EQ(RoundToBf16(1.0f), 1.0f);
  // bf16 keeps 7 mantissa bits: 1 + 2^-7 is representable, 1 + 2^-8 is the
  // tie between 1 and 1 + 2^-7 and goes to the even one (1).
  EXPECT_EQ(RoundToBf16(1.0f + 0x1p-7f), 1.0f + 0x1p-7f);
  EXPECT_EQ(RoundToBf16(1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(RoundToBf16(1.0f + 0x1p-7f + 0x1p-8f), 1.0f + 0x1p-6f);
  EXPECT_EQ(RoundToBf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_EQ(RoundToBf16(-3.0f), -3.0f);
  EXPECT_EQ(RoundToBf16(0.0f), 0.0f);
  EXPECT_TRUE(std::isinf(RoundToBf16(std::numeric_limits<float>::max())));
  EXPECT_TRUE(std::isinf(RoundToBf16(-INFINITY)));
  EXPECT_TRUE(std::isnan(RoundToBf16(std::nanf(""))));
  // A NaN whose payload is only in the low bits must not become infinity.
  uint32_t bits = 0x7f800001u;
  float low_nan;
  std::memcpy(&low_nan, &bits, sizeof(low_nan));
  EXPECT_TRUE(std::isnan(RoundToBf16(low_nan)));
  EXPECT_EQ(PrecisionName(Precision::kBf16), "bf16");
}

// The storage casts: to bf16 bit for bit RoundToBf16 (ties, NaN, overflow,
// subnormals, signed zero included), and back exactly.
TEST(CpuBackendTest, CastsToBf16AsRoundToBf16AndBackExactly) {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               1.0f + 0x1p-8f,            // A tie: to even (1).
                               1.0f + 0x1p-7f + 0x1p-8f,  // A tie: up.
                               -3.0f,
                               std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(),
                               0x1.fffffep-127f,  // Largest subnormal.
                               INFINITY,
                               -INFINITY,
                               std::nanf("")};
  uint32_t low_nan_bits = 0x7f800001u;  // Payload in the dropped bits only.
  float low_nan;
  std::memcpy(&low_nan, &low_nan_bits, sizeof(low_nan));
  values.push_back(low_nan);
  for (float v : Random(4096, 7)) values.push_back(v * 1e3f);
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor x = FromVector({n}, values);
  Tensor h = *B()->Empty({n}, DType::kBF16);
  Tensor back = *B()->Empty({n}, DType::kF32);
  B()->CastToBf16(x, h);
  B()->CastFromBf16(h, back);
  const uint16_t* hb = static_cast<const uint16_t*>(h.raw());
  const std::vector<float> got = ToVector(back);
  for (int64_t i = 0; i < n; ++i) {
    const float want = RoundToBf16(values[i]);
    uint32_t want_bits;
    std::memcpy(&want_bits, &want, sizeof(want_bits));
    if (std::isnan(values[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
      continue;
    }
    EXPECT_EQ(hb[i], want_bits >> 16) << i << ": " << values[i];
    uint32_t got_bits;
    std::memcpy(&got_bits, &got[i], sizeof(got_bits));
    EXPECT_EQ(got_bits, want_bits) << i << ": " << values[i];
  }
}

// What a stage boundary does to a tensor under each precision.
TEST(CpuBackendTest, ABoundaryIsBf16OnlyUnderBf16) {
  Tensor x = RandomTensor({3, 5}, 11);
  absl::StatusOr<Tensor> fp32 = ToBoundary(x, Precision::kFp32);
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ(fp32->raw(), x.raw());  // Sent as it is.
  absl::StatusOr<Tensor> bf16 = ToBoundary(x, Precision::kBf16);
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->dtype(), DType::kBF16);
  EXPECT_EQ(bf16->bytes() * 2, x.bytes());
  EXPECT_EQ(bf16->shape(), x.shape());
  absl::StatusOr<Tensor> received = FromBoundary(*bf16);
  ASSERT_TRUE(received.ok());
  EXPECT_EQ(received->dtype(), DType::kF32);
  absl::StatusOr<Tensor> through = ThroughBoundary(x, Precision::kBf16);
  ASSERT_TRUE(through.ok());
  const std::vector<float> in = ToVector(x), out = ToVector(*through);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i], RoundToBf16(in[i])) << i;
    EXPECT_NE(out[i], in[i]) << i;  // Random values all lose bits.
  }
  EXPECT_EQ(ToVector(*received), out);
  // Token ids (or any non-f32 tensor) are never rounded.
  Tensor ids = Ids({3}, {1, 2, 3});
  EXPECT_EQ(ToBoundary(ids, Precision::kBf16)->dtype(), DType::kI64);
}

TEST(CpuBackendTest, Bf16GemmMultipliesTheRoundedInputsInFp32) {
  const int m = 6, n = 5, k = 9;
  CpuBackend* bf16 = CpuBackend::Get(Precision::kBf16);
  EXPECT_NE(bf16, B());
  EXPECT_EQ(bf16->precision(), Precision::kBf16);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = Random(m * k, 11), b = Random(k * n, 12), c = Random(m * n, 13);
      Tensor ta_t = FromVector(ta ? Shape{k, m} : Shape{m, k}, a);
      Tensor tb_t = FromVector(tb ? Shape{n, k} : Shape{k, n}, b);
      Tensor tc = FromVector({m, n}, c);
      bf16->Gemm(ta, tb, 0.5f, ta_t, tb_t, 2.0f, tc);
      std::vector<float> ra = a, rb = b;
      for (float& x : ra) x = RoundToBf16(x);
      for (float& x : rb) x = RoundToBf16(x);
      const std::vector<float> got = ToVector(tc);
      EXPECT_TRUE(AllClose(
          got, NaiveGemm(ta, tb, m, n, k, 0.5f, ra, rb, 2.0f, c), 1e-5, 1e-5))
          << "ta=" << ta << " tb=" << tb;
      // ... which is not the fp32 product: the rounding happened.
      EXPECT_FALSE(AllClose(
          got, NaiveGemm(ta, tb, m, n, k, 0.5f, a, b, 2.0f, c), 1e-6, 1e-6));
      // The inputs themselves are untouched.
      EXPECT_EQ(ToVector(ta_t), a);
    }
  }
}

TEST(CpuBackendTest, GemmWithEmptyInnerDimensionZeroesCLikeBlas) {
  // k == 0 and beta == 0: C must become 0 even where it held NaN.
  std::vector<float> c(6, std::nanf(""));
  GemmBatch g;
  g.m = 2;
  g.n = 3;
  g.k = 0;
  g.c = c.data();
  g.ldc = 3;
  B()->GemmStridedBatched(g);
  EXPECT_EQ(c, std::vector<float>(6, 0.0f));
}

TEST(ParallelTest, ExceptionsReachTheCallerAfterEveryPartStopped) {
  const int64_t n = int64_t{1} << 22;  // Above the grain: split across cores.
  std::vector<unsigned char> touched(n, 0);
  EXPECT_THROW(ParallelFor(n,
                           [&](int64_t i) {
                             touched[i] = 1;
                             if (i == n - 1) throw std::runtime_error("boom");
                           }),
               std::runtime_error);
  // The pool is still usable afterwards.
  int64_t sum = 0;
  ParallelChunks(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) touched[i] = 2;
  });
  for (unsigned char t : touched) sum += t;
  EXPECT_EQ(sum, 2 * n);
}

TEST(CpuBackendTest, ElementwiseKernels) {
  Tensor x = FromVector({2, 3}, {1, -2, 3, -4, 5, -6});
  Tensor y = ZerosLike(x);
  B()->Relu(x, y);
  EXPECT_EQ(ToVector(y), (std::vector<float>{1, 0, 3, 0, 5, 0}));
  Tensor dx = ZerosLike(x);
  B()->ReluBackward(x, FromVector({2, 3}, {1, 1, 1, 1, 1, 1}), dx);
  EXPECT_EQ(ToVector(dx), (std::vector<float>{1, 0, 1, 0, 1, 0}));
  Tensor bias = FromVector({3}, {10, 20, 30});
  B()->AddRowBias(y, bias);
  EXPECT_EQ(ToVector(y), (std::vector<float>{11, 20, 33, 10, 25, 30}));
  Tensor sums = FromVector({3}, {1, 1, 1});
  B()->SumRows(x, 1.0f, sums);
  EXPECT_EQ(ToVector(sums), (std::vector<float>{-2, 4, -2}));
  B()->Axpy(2.0f, x, y);
  EXPECT_EQ(ToVector(y), (std::vector<float>{13, 16, 39, 2, 35, 18}));
  B()->Scale(y, 0.5f);
  EXPECT_EQ(ToVector(y)[0], 6.5f);
  Tensor sum = ZerosLike(x);
  B()->Add(x, x, sum);
  EXPECT_EQ(ToVector(sum)[2], 6.0f);
  EXPECT_DOUBLE_EQ(*B()->SumSquares(x), 1 + 4 + 9 + 16 + 25 + 36);
}

// Central finite difference of a scalar function of one input element.
double NumericGrad(const std::function<double()>& f, float* x, double h) {
  const float saved = *x;
  *x = static_cast<float>(saved + h);
  const double up = f();
  *x = static_cast<float>(saved - h);
  const double down = f();
  *x = saved;
  return (up - down) / (2 * h);
}

TEST(CpuBackendTest, GeluMatchesTorchValuesAndItsDerivative) {
  // torch.nn.GELU()(torch.tensor([-1., 0.5, 2.])) and approximate='tanh'.
  Tensor x = FromVector({3}, {-1.0f, 0.5f, 2.0f});
  Tensor y = ZerosLike(x);
  B()->Gelu(x, false, y);
  EXPECT_TRUE(
      AllClose(ToVector(y), {-0.158655f, 0.345731f, 1.954500f}, 0, 1e-5));
  B()->Gelu(x, true, y);
  EXPECT_TRUE(
      AllClose(ToVector(y), {-0.158808f, 0.345714f, 1.954598f}, 0, 1e-5));
  for (bool tanh : {false, true}) {
    Tensor dx = ZerosLike(x);
    B()->GeluBackward(x, tanh, FromVector({3}, {1, 1, 1}), dx);
    for (int i = 0; i < 3; ++i) {
      auto f = [&] {
        B()->Gelu(x, tanh, y);
        return static_cast<double>(y.data<float>()[i]);
      };
      EXPECT_NEAR(dx.data<float>()[i],
                  NumericGrad(f, x.data<float>() + i, 1e-3), 1e-3);
    }
  }
}

TEST(CpuBackendTest, LayerNormForwardAndBothBackwards) {
  const int rows = 3, cols = 5;
  Tensor x = RandomTensor({rows, cols}, 7), g = RandomTensor({cols}, 8),
         b = RandomTensor({cols}, 9), w = RandomTensor({rows, cols}, 10);
  Tensor y = ZerosLike(x), mean = *B()->Zeros({rows}),
         rstd = *B()->Zeros({rows});
  auto loss = [&] {
    B()->LayerNorm(x, g, b, 1e-5f, y, mean, rstd);
    double s = 0;
    for (int i = 0; i < rows * cols; ++i)
      s += y.data<float>()[i] * w.data<float>()[i];
    return s;
  };
  loss();
  // Each normalized row has mean ~0 and variance ~1 before the affine part.
  for (int r = 0; r < rows; ++r) {
    double mu = 0;
    for (int c = 0; c < cols; ++c) {
      mu += (y.data<float>()[r * cols + c] - b.data<float>()[c]) /
            g.data<float>()[c];
    }
    EXPECT_NEAR(mu / cols, 0.0, 1e-5);
  }
  Tensor dx = ZerosLike(x), dg = ZerosLike(g), db = ZerosLike(b);
  B()->LayerNormBackwardInput(x, g, mean, rstd, w, dx);
  B()->LayerNormBackwardWeight(x, mean, rstd, w, dg, db);
  for (int i = 0; i < rows * cols; ++i) {
    EXPECT_NEAR(dx.data<float>()[i],
                NumericGrad(loss, x.data<float>() + i, 1e-2), 2e-2);
  }
  for (int c = 0; c < cols; ++c) {
    EXPECT_NEAR(dg.data<float>()[c],
                NumericGrad(loss, g.data<float>() + c, 1e-2), 2e-2);
    EXPECT_NEAR(db.data<float>()[c],
                NumericGrad(loss, b.data<float>() + c, 1e-2), 2e-2);
  }
}

TEST(CpuBackendTest, CausalSoftmaxMasksTheFutureAndBackwardMatches) {
  const int batch = 2, s = 3;
  Tensor x = RandomTensor({batch, s, s}, 11),
         w = RandomTensor({batch, s, s}, 12);
  Tensor y = ZerosLike(x);
  auto loss = [&] {
    B()->Softmax(x, 0.5f, true, y);
    double sum = 0;
    for (int i = 0; i < batch * s * s; ++i)
      sum += y.data<float>()[i] * w.data<float>()[i];
    return sum;
  };
  loss();
  for (int bi = 0; bi < batch; ++bi) {
    for (int r = 0; r < s; ++r) {
      double row = 0;
      for (int c = 0; c < s; ++c) {
        const float v = y.data<float>()[(bi * s + r) * s + c];
        if (c > r) {
          EXPECT_EQ(v, 0.0f);
        }
        row += v;
      }
      EXPECT_NEAR(row, 1.0, 1e-6);
    }
  }
  Tensor dx = ZerosLike(x);
  B()->SoftmaxBackward(y, w, 0.5f, dx);
  for (int i = 0; i < batch * s * s; ++i) {
    EXPECT_NEAR(dx.data<float>()[i],
                NumericGrad(loss, x.data<float>() + i, 1e-2), 1e-3);
  }
}

TEST(CpuBackendTest, SplitAndMergeHeadsFollowTorchLayout) {
  const int b = 2, s = 3, h = 2, d = 2;
  std::vector<float> packed(b * s * 3 * h * d);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<float>(i);
  Tensor qkv = FromVector({b, s, 3 * h * d}, packed);
  Tensor q = *B()->Zeros({b, h, s, d}), k = *B()->Zeros({b, h, s, d}),
         v = *B()->Zeros({b, h, s, d});
  B()->SplitHeads(qkv, h, q, k, v);
  // k[b=1, h=1, s=2, d=1] = qkv[1, 2, 1 (k), 1, 1].
  EXPECT_EQ(k.data<float>()[((1 * h + 1) * s + 2) * d + 1],
            packed[(((1 * s + 2) * 3 + 1) * h + 1) * d + 1]);
  Tensor back = ZerosLike(qkv);
  B()->SplitHeadsBackward(q, k, v, h, back);
  EXPECT_EQ(ToVector(back), packed);
  Tensor merged = *B()->Zeros({b, s, h * d});
  B()->MergeHeads(q, merged);
  Tensor q2 = ZerosLike(q);
  B()->MergeHeadsBackward(merged, q2);
  EXPECT_EQ(ToVector(q2), ToVector(q));
  // merged[b, s, h*d + i] = q[b, h, s, i].
  EXPECT_EQ(merged.data<float>()[(1 * s + 2) * h * d + 1 * d + 0],
            q.data<float>()[((1 * h + 1) * s + 2) * d + 0]);
}

TEST(CpuBackendTest, EmbeddingGathersScattersAndRejectsBadIds) {
  Tensor table = FromVector({3, 2}, {0, 1, 10, 11, 20, 21});
  Tensor ids = Ids({4}, {2, 0, 2, 1});
  Tensor out = *B()->Zeros({4, 2});
  ASSERT_TRUE(B()->EmbeddingForward(ids, table, out).ok());
  EXPECT_EQ(ToVector(out), (std::vector<float>{20, 21, 0, 1, 20, 21, 10, 11}));
  Tensor grad = ZerosLike(table);
  B()->EmbeddingBackward(ids, FromVector({4, 2}, {1, 1, 1, 1, 1, 1, 1, 1}),
                         grad);
  EXPECT_EQ(ToVector(grad), (std::vector<float>{1, 1, 1, 1, 2, 2}));
  absl::Status bad =
      B()->EmbeddingForward(Ids({1}, {3}), table, out.Rows(0, 1));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("token id 3 at position 0"));
}

TEST(CpuBackendTest, LossesMatchReferencesAndGradients) {
  Tensor y = FromVector({2, 2}, {1, 2, 3, 4}),
         t = FromVector({2, 2}, {0, 2, 5, 4});
  Tensor dy = ZerosLike(y);
  EXPECT_FLOAT_EQ(*B()->MseLoss(y, t, 1.0f, dy), (1.0f + 0 + 4 + 0) / 4);
  EXPECT_EQ(ToVector(dy), (std::vector<float>{0.5f, 0, -1.0f, 0}));
  // torch.nn.functional.cross_entropy([[1,2,3],[1,1,1]], [2,0]) = 0.9831.
  Tensor logits = FromVector({2, 3}, {1, 2, 3, 1, 1, 1});
  Tensor dl = ZerosLike(logits);
  auto ce = B()->CrossEntropyLoss(logits, Ids({2}, {2, 0}), 1.0f, dl);
  ASSERT_TRUE(ce.ok());
  EXPECT_NEAR(*ce, 0.5 * (0.40760596 + 1.09861229), 1e-6);
  Tensor scratch = ZerosLike(logits);
  for (int i = 0; i < 6; ++i) {
    auto f = [&] {
      return static_cast<double>(
          *B()->CrossEntropyLoss(logits, Ids({2}, {2, 0}), 1.0f, scratch));
    };
    EXPECT_NEAR(dl.data<float>()[i],
                NumericGrad(f, logits.data<float>() + i, 1e-2), 1e-4);
  }
  auto bad = B()->CrossEntropyLoss(logits, Ids({2}, {3, 0}), 1.0f, dl);
  EXPECT_THAT(bad.status().message(), HasSubstr("target 3 at position 0"));
  auto mismatch = B()->MseLoss(y, FromVector({3}, {1, 2, 3}), 1.0f, dy);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackendTest, OptimizersFollowTorchOptim) {
  // SGD momentum 0.9, nesterov off, wd 0.1, lr 0.1, two steps with grad 1:
  // step 1: d = 1 + 0.1 * 1 = 1.1, buf = 1.1, w = 1 - 0.11 = 0.89;
  // step 2: d = 1 + 0.089 = 1.089, buf = 0.99 + 1.089 = 2.079,
  //         w = 0.89 - 0.2079 = 0.6821.
  Tensor w = FromVector({1}, {1}), g = FromVector({1}, {1}),
         buf = FromVector({1}, {0});
  SgdParams sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.1f};
  B()->SgdUpdate(sgd, w, g, buf);
  sgd.first_step = false;
  B()->SgdUpdate(sgd, w, g, buf);
  EXPECT_NEAR(ToVector(w)[0], 0.6821f, 1e-6);
  // Adam lr 0.1, one step with grad 2: w -= lr * m_hat / (sqrt(v_hat) + eps)
  // = 0.1 * 2 / (2 + 1e-8) ~ 0.1. AdamW wd 0.5 first scales w by 1 - 0.05.
  Tensor w2 = FromVector({1}, {1}), g2 = FromVector({1}, {2});
  Tensor m = FromVector({1}, {0}), v = FromVector({1}, {0});
  B()->AdamUpdate({.lr = 0.1f}, w2, g2, m, v);
  EXPECT_NEAR(ToVector(w2)[0], 0.9f, 1e-6);
  Tensor w3 = FromVector({1}, {1}), m3 = FromVector({1}, {0}),
         v3 = FromVector({1}, {0});
  B()->AdamUpdate(
      {.lr = 0.1f, .weight_decay = 0.5f, .decoupled_weight_decay = true}, w3,
      g2, m3, v3);
  EXPECT_NEAR(ToVector(w3)[0], 0.95f - 0.1f, 1e-6);
}

// --- Vectorised kernels against straightforward double-precision loops ----
// Sizes are chosen so that rows have whole 4-lane vectors and a tail (130 =
// 32 x 4 + 2), and the tolerances follow from each approximation's error
// bound (engine/cpu/internal/vector_math.h) times the factors applied after
// it.

std::vector<double> Doubles(const Tensor& t) {
  std::vector<float> f = ToVector(t);
  return std::vector<double>(f.begin(), f.end());
}

TEST(VectorMathTest, ExpIsWithinAFewUlpOfLibmAndClampsItsRange) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 1e-3) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    const double got = cpu_internal::Exp(cpu_internal::Splat(xf))[0];
    worst = std::max(worst, std::abs(got - want) / want);
  }
  // Eight fp32 roundings in the polynomial and scaling (6e-8 each, mostly
  // cancelling) plus a 3e-9 series remainder: well under 3e-7.
  EXPECT_LT(worst, 3e-7);
  const cpu_internal::Vf extremes = cpu_internal::Exp(cpu_internal::Vf{
      -1e4f, 1e4f, -std::numeric_limits<float>::infinity(), 0.0f});
  EXPECT_GT(extremes[0], 0.0f);
  EXPECT_LT(extremes[0], 1e-37f);
  EXPECT_TRUE(std::isfinite(extremes[1]));
  EXPECT_GT(extremes[2], 0.0f);
  EXPECT_EQ(extremes[3], 1.0f);
}

TEST(VectorMathTest, ErfIsWithinItsApproximationBoundAndReturnsTheGaussian) {
  double worst_erf = 0, worst_gauss = 0;
  for (double x = -6.0; x <= 6.0; x += 1e-4) {
    const float xf = static_cast<float>(x);
    cpu_internal::Vf gauss;
    const double got = cpu_internal::Erf(cpu_internal::Splat(xf), &gauss)[0];
    worst_erf = std::max(worst_erf, std::abs(got - std::erf(double{xf})));
    const double want_gauss = std::exp(-double{xf} * xf);
    worst_gauss =
        std::max(worst_gauss, std::abs(gauss[0] - want_gauss) / want_gauss);
  }
  // Abramowitz-Stegun 7.1.26 is within 1.5e-7; evaluating 1 - t P(t) e^-x^2
  // in fp32 adds a few ulp of 1 (6e-8 each).
  EXPECT_LT(worst_erf, 6e-7);
  // exp(-x^2) with x^2 rounded: relative error |x^2| * 6e-8 <= 2.2e-6 at 6.
  EXPECT_LT(worst_gauss, 3e-6);
}

TEST(VectorMathTest, ScaledMaxIsTheScalarLoopsMaxForEveryTail) {
  EXPECT_EQ(cpu_internal::ScaledMax(nullptr, 0, 1.0f),
            -std::numeric_limits<float>::infinity());
  const std::vector<float> xs = Random(23, 37, 5.0f);
  for (int64_t n = 1; n <= 23; ++n) {
    for (const float scale : {1.0f, 0.125f, -2.0f}) {
      float want = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i) want = std::max(want, scale * xs[i]);
      EXPECT_EQ(cpu_internal::ScaledMax(xs.data(), n, scale), want)
          << "n = " << n << ", scale " << scale;
    }
  }
  // The largest element in the tail, past the last whole vector.
  std::vector<float> tail(9, -1.0f);
  tail[8] = 3.0f;
  EXPECT_EQ(cpu_internal::ScaledMax(tail.data(), 9, 1.0f), 3.0f);
}

TEST(CpuBackendTest, GeluKernelsMatchADoubleReferenceOnVectorsAndTails) {
  const int n = 1027;  // 256 vectors and a tail of 3.
  Tensor x = RandomTensor({n}, 21, 2.0f), dy = RandomTensor({n}, 22);
  Tensor y = ZerosLike(x), dx = ZerosLike(x);
  const std::vector<double> xs = Doubles(x), gs = Doubles(dy);
  for (bool tanh : {false, true}) {
    B()->Gelu(x, tanh, y);
    B()->GeluBackward(x, tanh, dy, dx);
    for (int i = 0; i < n; ++i) {
      const double v = xs[i];
      double cdf, dcdf;
      if (tanh) {
        const double k = std::sqrt(2.0 / M_PI),
                     u = k * (v + 0.044715 * v * v * v);
        const double t = std::tanh(u);
        cdf = 0.5 * (1 + t);
        dcdf = 0.5 * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
      } else {
        cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
        dcdf = std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
      }
      // The cdf is within 6e-7 (erf / 2, or tanh's few ulp of 1); GELU
      // multiplies it by |x| (< 10 here), and the derivative adds x pdf.
      const double tol = 1e-6 * (1 + std::abs(v));
      EXPECT_NEAR(y.data<float>()[i], v * cdf, tol) << "x=" << v;
      EXPECT_NEAR(dx.data<float>()[i], gs[i] * (cdf + v * dcdf),
                  tol * (1 + std::abs(gs[i])))
          << "x=" << v << " tanh=" << tanh;
    }
  }
}

TEST(CpuBackendTest, SumRowsEqualsAnInOrderDoubleSumExactly) {
  // The kernel sums each column's rows in order in double, split into
  // column bands across threads when large: the same bits as this loop,
  // whatever the split. The second shape is above the parallel grain.
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 130}, {2, kParallelGrain / 2 + 3}}) {
    Tensor x = RandomTensor({rows, cols}, 23);
    Tensor out = RandomTensor({cols}, 24);
    const std::vector<float> xs = ToVector(x), before = ToVector(out);
    B()->SumRows(x, 0.5f, out);
    const std::vector<float> got = ToVector(out);
    for (int64_t c = 0; c < cols; ++c) {
      double sum = 0;
      for (int64_t r = 0; r < rows; ++r) sum += xs[r * cols + c];
      ASSERT_EQ(got[c], 0.5f * before[c] + static_cast<float>(sum))
          << "column " << c << " of [" << rows << ", " << cols << "]";
    }
  }
}

TEST(CpuBackendTest, SumSquaresMatchesALongDoubleSumOnVectorsAndTails) {
  // Every term is a float's square, exact in double and non-negative, so
  // any order of the additions is within n * 2^-53 relative of the exact
  // sum: a well-posed bound. The lengths cover the vector loop's tail (n mod
  // 8 from 0 to 7) and a gradient-sized tensor.
  for (const int64_t n : {0, 1, 7, 8, 9, 15, 16, 1003, 250001}) {
    Tensor x = RandomTensor({n}, 36, 3.0f);
    const std::vector<float> xs = ToVector(x);
    long double exact = 0;
    for (const float v : xs) exact += static_cast<long double>(v) * v;
    const double got = *B()->SumSquares(x);
    const double bound =
        static_cast<double>(exact) * static_cast<double>(n) * 0x1p-53;
    EXPECT_NEAR(got, static_cast<double>(exact), bound) << "n = " << n;
    if (n == 1) {
      EXPECT_EQ(got, static_cast<double>(xs[0]) * xs[0]);
    }
  }
}

TEST(CpuBackendTest, LayerNormKernelsMatchADoubleReferenceOnWideRows) {
  const int rows = 9, cols = 130;
  const float eps = 1e-5f;
  Tensor x = RandomTensor({rows, cols}, 25, 3.0f), g = RandomTensor({cols}, 26),
         b = RandomTensor({cols}, 27), dy = RandomTensor({rows, cols}, 28);
  Tensor y = ZerosLike(x), mean = *B()->Zeros({rows}),
         rstd = *B()->Zeros({rows});
  B()->LayerNorm(x, g, b, eps, y, mean, rstd);
  Tensor dx = ZerosLike(x), dg = ZerosLike(g), db = ZerosLike(b);
  B()->LayerNormBackwardInput(x, g, mean, rstd, dy, dx);
  B()->LayerNormBackwardWeight(x, mean, rstd, dy, dg, db);
  const std::vector<double> xs = Doubles(x), gs = Doubles(g), bs = Doubles(b),
                            dys = Doubles(dy);
  std::vector<double> want_dg(cols, 0.0), want_db(cols, 0.0);
  for (int r = 0; r < rows; ++r) {
    const double* row = xs.data() + r * cols;
    double mu = 0, var = 0;
    for (int c = 0; c < cols; ++c) mu += row[c];
    mu /= cols;
    for (int c = 0; c < cols; ++c) var += (row[c] - mu) * (row[c] - mu);
    const double inv = 1 / std::sqrt(var / cols + eps);
    EXPECT_NEAR(mean.data<float>()[r], mu, 1e-6);
    EXPECT_NEAR(rstd.data<float>()[r], inv, 1e-6 * inv);
    double sum_g = 0, sum_gx = 0;
    for (int c = 0; c < cols; ++c) {
      const double xhat = (row[c] - mu) * inv, d = dys[r * cols + c] * gs[c];
      sum_g += d;
      sum_gx += d * xhat;
      want_dg[c] += dys[r * cols + c] * xhat;
      want_db[c] += dys[r * cols + c];
      // xhat is within a few fp32 roundings of |xhat| (< 4 here), scaled
      // by gamma (< 4).
      EXPECT_NEAR(y.data<float>()[r * cols + c], xhat * gs[c] + bs[c], 1e-5);
    }
    for (int c = 0; c < cols; ++c) {
      const double xhat = (row[c] - mu) * inv, d = dys[r * cols + c] * gs[c];
      const double want = inv * (d - sum_g / cols - xhat * sum_gx / cols);
      // Each term is O(inv * |d|) <= 0.3 * 16: fp32 leaves ~1e-6 of that.
      EXPECT_NEAR(dx.data<float>()[r * cols + c], want, 1e-5);
    }
  }
  for (int c = 0; c < cols; ++c) {
    EXPECT_NEAR(dg.data<float>()[c], want_dg[c], 1e-5 * (1 + rows));
    EXPECT_NEAR(db.data<float>()[c], want_db[c], 1e-6 * (1 + rows));
  }
}

TEST(CpuBackendTest, SoftmaxKernelsMatchADoubleReferenceOnWideRows) {
  const int heads = 2, s = 67;  // Rows see 1..67 keys: every tail length.
  const float scale = 0.3f;
  for (bool causal : {false, true}) {
    Tensor x = RandomTensor({heads, s, s}, 29, 3.0f),
           dy = RandomTensor({heads, s, s}, 30);
    Tensor y = ZerosLike(x), dx = ZerosLike(x);
    B()->Softmax(x, scale, causal, y);
    B()->SoftmaxBackward(y, dy, scale, dx);
    const std::vector<double> xs = Doubles(x), dys = Doubles(dy);
    for (int r = 0; r < heads * s; ++r) {
      const int visible = causal ? r % s + 1 : s;
      const double* in = xs.data() + r * s;
      double max = -1e300, sum = 0;
      for (int c = 0; c < visible; ++c) max = std::max(max, scale * in[c]);
      for (int c = 0; c < visible; ++c) sum += std::exp(scale * in[c] - max);
      std::vector<double> p(s, 0.0);
      double dot = 0;
      for (int c = 0; c < visible; ++c) {
        p[c] = std::exp(scale * in[c] - max) / sum;
        dot += p[c] * dys[r * s + c];
      }
      for (int c = 0; c < s; ++c) {
        // Probabilities <= 1 with Exp's 3e-7 relative error, normalised.
        EXPECT_NEAR(y.data<float>()[r * s + c], p[c], 1e-6);
        EXPECT_NEAR(dx.data<float>()[r * s + c],
                    scale * p[c] * (dys[r * s + c] - dot), 2e-6);
      }
    }
  }
}

TEST(CpuBackendTest, CrossEntropyMatchesADoubleReferenceOverAWideVocabulary) {
  const int n = 5, vocab = 258;  // 64 vectors and a tail of 2.
  Tensor logits = RandomTensor({n, vocab}, 31, 4.0f);
  Tensor targets = Ids({n}, {0, 257, 100, 3, 255});
  Tensor dl = ZerosLike(logits);
  auto loss = B()->CrossEntropyLoss(logits, targets, 2.0f, dl);
  ASSERT_TRUE(loss.ok());
  const std::vector<double> ls = Doubles(logits);
  const int64_t* t = targets.data<int64_t>();
  double want_loss = 0;
  for (int r = 0; r < n; ++r) {
    const double* in = ls.data() + r * vocab;
    const double max = *std::max_element(in, in + vocab);
    double sum = 0;
    for (int c = 0; c < vocab; ++c) sum += std::exp(in[c] - max);
    want_loss += std::log(sum) - (in[t[r]] - max);
    for (int c = 0; c < vocab; ++c) {
      const double p = std::exp(in[c] - max) / sum;
      // grad_scale / n = 0.4 times (p - onehot), p with 3e-7 relative error.
      EXPECT_NEAR(dl.data<float>()[r * vocab + c],
                  0.4 * (p - (c == t[r] ? 1.0 : 0.0)), 2e-7);
    }
  }
  EXPECT_NEAR(*loss, want_loss / n, 1e-6 * want_loss / n);
}

TEST(CpuBackendTest, AdamOnVectorsIsBitForBitTheScalarUpdate) {
  const int n = 1027;
  for (bool decoupled : {false, true}) {
    const AdamParams p{.lr = 0.01f,
                       .weight_decay = 0.1f,
                       .decoupled_weight_decay = decoupled,
                       .step = 3};
    std::vector<float> w = Random(n, 32), g = Random(n, 33), m = Random(n, 34),
                       v = Random(n, 35);
    for (float& x : v) x = x * x;
    Tensor tw = FromVector({n}, w), tg = FromVector({n}, g),
           tm = FromVector({n}, m), tv = FromVector({n}, v);
    B()->AdamUpdate(p, tw, tg, tm, tv);
    // The scalar loop the kernel replaced.
    const double bias1 = 1.0 - std::pow(static_cast<double>(p.beta1), p.step);
    const double bias2 = 1.0 - std::pow(static_cast<double>(p.beta2), p.step);
    const float step_size = static_cast<float>(p.lr / bias1);
    const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
    for (int i = 0; i < n; ++i) {
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
    }
    EXPECT_EQ(ToVector(tw), w) << "decoupled=" << decoupled;
    EXPECT_EQ(ToVector(tm), m);
    EXPECT_EQ(ToVector(tv), v);
  }
}

// The step line's memory: every CPU tensor counts (both precisions'
// instances share host memory), freed ones come off, and a reset starts the
// peak at what is held now.
TEST(CpuBackendTest, MemoryStatsCountTensorsAndTheirPeak) {
  CpuBackend* be = CpuBackend::Get();
  be->ResetPeakMemory();
  const MemoryStats before = be->memory_stats();
  EXPECT_EQ(before.peak_allocated, before.allocated);
  EXPECT_EQ(before.reserved, before.allocated);
  EXPECT_GT(before.capacity, 0u);  // This machine's RAM.
  {
    const Tensor a = *be->Empty({1000, 1000}, DType::kF32);
    const Tensor b =
        *CpuBackend::Get(Precision::kBf16)->Empty({500, 1000}, DType::kF32);
    const MemoryStats held = be->memory_stats();
    EXPECT_GE(held.allocated, before.allocated + 6000000);
    EXPECT_GE(held.peak_allocated, held.allocated);
  }
  const MemoryStats after = be->memory_stats();
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak_allocated, before.allocated + 6000000);
  be->ResetPeakMemory();
  EXPECT_EQ(be->memory_stats().peak_allocated, before.allocated);
}

}  // namespace
}  // namespace conveyor::engine
