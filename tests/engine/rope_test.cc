// The rope tables of every rope_scaling type against closed forms computed
// here in double from the definitions (HF's modeling_rope_utils.py), with
// llama3's three bands and yarn's ramp checked at hand-picked frequencies;
// the range checks; and the cache that holds a table on a backend.
#include "engine/rope.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

constexpr double kPi = std::numbers::pi;

// 1 / theta^(2i / d) in double: the unscaled frequencies.
std::vector<double> Plain(double theta, int64_t d) {
  std::vector<double> f(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    f[i] = 1.0 / std::pow(theta, 2.0 * i / d);
  }
  return f;
}

// The float table is HF's float32 computation: within a few float
// roundings of the double closed form.
void ExpectTable(const std::vector<float>& got, const std::vector<double>& want,
                 double rtol = 2e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i])) << "pair " << i;
  }
}

TEST(RopeTest, DefaultIsInverseThetaPowers) {
  const RopeTable t = ComputeRopeTable({}, 500000.0, 64, 4096);
  ExpectTable(t.inv_freq, Plain(500000.0, 64));
  EXPECT_EQ(t.inv_freq[0], 1.0f);
  EXPECT_EQ(t.attention_factor, 1.0f);
}

TEST(RopeTest, LinearDividesEveryFrequencyByTheFactor) {
  RopeScaling s{.type = RopeType::kLinear, .factor = 4.0};
  const RopeTable t = ComputeRopeTable(s, 10000.0, 16, 100);
  std::vector<double> want = Plain(10000.0, 16);
  for (double& f : want) f /= 4.0;
  ExpectTable(t.inv_freq, want);
  EXPECT_EQ(t.attention_factor, 1.0f);
}

TEST(RopeTest, DynamicIsTheIdentityUpToTheOriginalLength) {
  RopeScaling s{.type = RopeType::kDynamic,
                .factor = 2.0,
                .original_max_position_embeddings = 128};
  const RopeTable plain = ComputeRopeTable({}, 10000.0, 16, 0);
  for (int64_t seq : {1, 64, 128}) {
    EXPECT_EQ(ComputeRopeTable(s, 10000.0, 16, seq), plain) << seq;
  }
}

TEST(RopeTest, DynamicGrowsThetaPastTheOriginalLength) {
  // base' = base (f s / L - (f - 1))^(d / (d - 2)): at s = 3L with f = 2,
  // base' = base * 5^(16/14).
  RopeScaling s{.type = RopeType::kDynamic,
                .factor = 2.0,
                .original_max_position_embeddings = 128};
  const RopeTable t = ComputeRopeTable(s, 10000.0, 16, 384);
  ExpectTable(t.inv_freq, Plain(10000.0 * std::pow(5.0, 16.0 / 14.0), 16),
              1e-5);
  EXPECT_EQ(t.attention_factor, 1.0f);
}

// llama3 at theta 10000, head_dim 16: pair i has wavelength
// 2 pi 10000^(i/8) = 6.28, 19.9, 62.8, 199, 628, ... With the original
// length 64, low_freq_factor 1 and high_freq_factor 4, wavelengths under
// 64 / 4 = 16 are kept (pair 0), over 64 / 1 = 64 divided by the factor
// (pairs 3 to 7), and pairs 1 and 2 lie in the band between, where
// smooth = (64 / wavelength - 1) / 3 blends f / factor and f.
TEST(RopeTest, Llama3KeepsHighScalesLowAndSmoothsTheBandBetween) {
  RopeScaling s{.type = RopeType::kLlama3,
                .factor = 8.0,
                .original_max_position_embeddings = 64,
                .low_freq_factor = 1.0,
                .high_freq_factor = 4.0};
  const RopeTable t = ComputeRopeTable(s, 10000.0, 16, 0);
  const std::vector<double> f = Plain(10000.0, 16);
  enum Band { kKept, kSmoothed, kScaled };
  const Band bands[8] = {kKept,   kSmoothed, kSmoothed, kScaled,
                         kScaled, kScaled,   kScaled,   kScaled};
  std::vector<double> want(8);
  for (int i = 0; i < 8; ++i) {
    const double wavelength = 2 * kPi / f[i];
    switch (bands[i]) {
      case kKept:
        ASSERT_LT(wavelength, 16.0);
        want[i] = f[i];
        break;
      case kScaled:
        ASSERT_GT(wavelength, 64.0);
        want[i] = f[i] / 8.0;
        break;
      case kSmoothed: {
        ASSERT_GT(wavelength, 16.0);
        ASSERT_LT(wavelength, 64.0);
        const double smooth = (64.0 / wavelength - 1.0) / 3.0;
        want[i] = (1 - smooth) * f[i] / 8.0 + smooth * f[i];
        break;
      }
    }
  }
  ExpectTable(t.inv_freq, want);
  // Pair 1 by hand: wavelength 19.87, smooth 0.7403, so f * 0.7727.
  EXPECT_NEAR(t.inv_freq[1] / f[1], 0.7403 + 0.2597 / 8, 1e-3);
  // Pair 2 barely inside the band: smooth 0.0062, nearly f / 8.
  EXPECT_NEAR(t.inv_freq[2] / f[2], 0.0062 + 0.9938 / 8, 1e-3);
  EXPECT_EQ(t.attention_factor, 1.0f);
}

TEST(RopeTest, Llama32ShapedTableScalesMostPairs) {
  // Llama 3.2's scaling on the tiny model of tests/worker: theta 1000,
  // head_dim 16, original length 8, so only the fastest pairs stay.
  RopeScaling s{.type = RopeType::kLlama3,
                .factor = 32.0,
                .original_max_position_embeddings = 8,
                .low_freq_factor = 1.0,
                .high_freq_factor = 4.0};
  const RopeTable t = ComputeRopeTable(s, 1000.0, 16, 0);
  const std::vector<double> f = Plain(1000.0, 16);
  // Wavelengths 6.28 (> 8 / 4 = 2 and < 8: smoothed), then > 8: scaled.
  const double smooth = (8.0 / (2 * kPi) - 1.0) / 3.0;
  EXPECT_NEAR(t.inv_freq[0], (1 - smooth) / 32 + smooth, 1e-6);
  for (int i = 1; i < 8; ++i) {
    EXPECT_NEAR(t.inv_freq[i], f[i] / 32, 2e-6 * f[i] / 32) << i;
  }
}

// yarn at theta 10000, head_dim 16, original length 64: the correction
// dimension of r rotations is 16 ln(64 / (2 pi r)) / (2 ln 10000):
// -0.994 for beta_fast 32 and 2.016 for beta_slow 1, truncated outwards
// to 0 and 3. The ramp (i - 0) / 3 then keeps pair 0, divides pairs 3 to
// 7 by the factor and blends pairs 1 and 2 by 1/3 and 2/3.
TEST(RopeTest, YarnRampsFromExtrapolatedToInterpolated) {
  RopeScaling s{.type = RopeType::kYarn,
                .factor = 4.0,
                .original_max_position_embeddings = 64};
  const RopeTable t = ComputeRopeTable(s, 10000.0, 16, 0);
  const std::vector<double> f = Plain(10000.0, 16);
  ASSERT_NEAR(16 * std::log(64 / (32 * 2 * kPi)) / (2 * std::log(10000.0)),
              -0.994, 1e-3);
  ASSERT_NEAR(16 * std::log(64 / (1 * 2 * kPi)) / (2 * std::log(10000.0)),
              2.016, 1e-3);
  const double ramp[8] = {0, 1.0 / 3, 2.0 / 3, 1, 1, 1, 1, 1};
  std::vector<double> want(8);
  for (int i = 0; i < 8; ++i) {
    want[i] = f[i] / 4.0 * ramp[i] + f[i] * (1 - ramp[i]);
  }
  ExpectTable(t.inv_freq, want);
  EXPECT_FLOAT_EQ(t.attention_factor, 0.1 * std::log(4.0) + 1.0);
}

TEST(RopeTest, YarnWithoutTruncationRampsBetweenTheExactDimensions) {
  RopeScaling s{.type = RopeType::kYarn,
                .factor = 4.0,
                .original_max_position_embeddings = 64,
                .truncate = false};
  const RopeTable t = ComputeRopeTable(s, 10000.0, 16, 0);
  const std::vector<double> f = Plain(10000.0, 16);
  auto correction = [](double r) {
    return 16 * std::log(64 / (r * 2 * kPi)) / (2 * std::log(10000.0));
  };
  const double low = std::max(correction(32), 0.0), high = correction(1);
  std::vector<double> want(8);
  for (int i = 0; i < 8; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    want[i] = f[i] / 4.0 * ramp + f[i] * (1 - ramp);
  }
  ExpectTable(t.inv_freq, want);
  // Pair 2 is nearly interpolated (ramp 2 / 2.016), not 2/3 of the way.
  EXPECT_NEAR(t.inv_freq[2], f[2] * (0.992 / 4 + 0.008), 1e-3 * f[2]);
}

TEST(RopeTest, YarnAttentionFactorFromMscalesOrGiven) {
  RopeScaling s{.type = RopeType::kYarn,
                .factor = 40.0,
                .original_max_position_embeddings = 4096,
                .mscale = 1.0,
                .mscale_all_dim = 0.707};
  // DeepSeek's ratio: (0.1 ln 40 + 1) / (0.0707 ln 40 + 1).
  EXPECT_FLOAT_EQ(
      ComputeRopeTable(s, 10000.0, 64, 0).attention_factor,
      (0.1 * std::log(40.0) + 1) / (0.1 * 0.707 * std::log(40.0) + 1));
  s.attention_factor = 0.5;  // Given: it wins.
  EXPECT_EQ(ComputeRopeTable(s, 10000.0, 64, 0).attention_factor, 0.5f);
  // A factor of 1 extends nothing: get_mscale is 1.
  RopeScaling one{.type = RopeType::kYarn,
                  .factor = 1.0,
                  .original_max_position_embeddings = 4096};
  EXPECT_EQ(ComputeRopeTable(one, 10000.0, 64, 0).attention_factor, 1.0f);
}

TEST(RopeTest, TypeNamesRoundTrip) {
  for (RopeType type :
       {RopeType::kDefault, RopeType::kLinear, RopeType::kDynamic,
        RopeType::kYarn, RopeType::kLlama3}) {
    EXPECT_EQ(RopeTypeFromName(RopeTypeName(type)), type);
  }
  EXPECT_EQ(RopeTypeName(RopeType::kLlama3), "llama3");
  EXPECT_EQ(RopeTypeFromName("longrope"), std::nullopt);
}

TEST(RopeTest, CheckNamesTheFirstBadKey) {
  auto key = [](const RopeScaling& s, double theta = 10000.0,
                int64_t head_dim = 16) {
    const auto p = CheckRopeScaling(s, theta, head_dim);
    return p.has_value() ? p->key + ": " + p->message : std::string("ok");
  };
  EXPECT_EQ(key({}), "ok");
  EXPECT_EQ(key({}, 0.0), "rope_theta: must be positive and finite; got 0");
  EXPECT_EQ(key({.type = RopeType::kLinear, .factor = 0.5}),
            "factor: must be a finite number >= 1 for rope_type linear; got "
            "0.5");
  EXPECT_EQ(key({.type = RopeType::kLlama3, .factor = 8}),
            "original_max_position_embeddings: must be a positive integer "
            "for rope_type llama3; got 0");
  EXPECT_EQ(key({.type = RopeType::kLlama3,
                 .factor = 8,
                 .original_max_position_embeddings = 64,
                 .low_freq_factor = 4,
                 .high_freq_factor = 4}),
            "high_freq_factor: must be finite and more than low_freq_factor "
            "(4); got 4");
  EXPECT_EQ(key({.type = RopeType::kLlama3,
                 .factor = 8,
                 .original_max_position_embeddings = 64,
                 .low_freq_factor = 0}),
            "low_freq_factor: must be positive and finite; got 0");
  const RopeScaling yarn{.type = RopeType::kYarn,
                         .factor = 4,
                         .original_max_position_embeddings = 64};
  EXPECT_EQ(key(yarn, 1.0),
            "rope_theta: must be more than 1 for rope_type "
            "yarn; got 1");
  RopeScaling bad = yarn;
  bad.beta_fast = 0.5;
  EXPECT_EQ(key(bad),
            "beta_fast: must be finite and at least beta_slow (1); "
            "got 0.5");
  bad = yarn;
  bad.attention_factor = -1;
  EXPECT_EQ(key(bad), "attention_factor: must be positive and finite; got -1");
  const RopeScaling dynamic{.type = RopeType::kDynamic,
                            .factor = 2,
                            .original_max_position_embeddings = 8};
  EXPECT_EQ(key(dynamic, 10000.0, 2),
            "head_dim: must be more than 2 for rope_type dynamic; got 2");
  EXPECT_EQ(key(dynamic, 10000.0, 0), "ok");  // head_dim not known yet
}

TEST(RopeTest, CacheUploadsOncePerLength) {
  Backend& cpu = *CpuBackend::Get();
  RopeFrequencyCache plain({}, 10000.0, 8);
  auto a = plain.Get(cpu, 4);
  auto b = plain.Get(cpu, 400);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->inv_freq.data<float>(), b->inv_freq.data<float>());
  EXPECT_EQ(testing_util::ToVector(a->inv_freq),
            ComputeRopeTable({}, 10000.0, 8, 0).inv_freq);

  const RopeScaling s{.type = RopeType::kDynamic,
                      .factor = 2,
                      .original_max_position_embeddings = 16};
  RopeFrequencyCache dynamic(s, 10000.0, 8);
  auto short1 = dynamic.Get(cpu, 3);
  auto short2 = dynamic.Get(cpu, 16);
  auto long1 = dynamic.Get(cpu, 40);
  ASSERT_TRUE(short1.ok() && short2.ok() && long1.ok());
  // Every length up to the original shares the default table.
  EXPECT_EQ(short1->inv_freq.data<float>(), short2->inv_freq.data<float>());
  EXPECT_EQ(testing_util::ToVector(short2->inv_freq),
            ComputeRopeTable({}, 10000.0, 8, 0).inv_freq);
  EXPECT_EQ(testing_util::ToVector(long1->inv_freq),
            ComputeRopeTable(s, 10000.0, 8, 40).inv_freq);
  EXPECT_NE(testing_util::ToVector(long1->inv_freq),
            testing_util::ToVector(short2->inv_freq));
}

}  // namespace
}  // namespace conveyor::engine
