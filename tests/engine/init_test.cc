#include "engine/init.h"

#include <cmath>
#include <vector>

#include "common/cancellation.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using testing_util::ToVector;

std::vector<float> Init(uint64_t seed, const char* name, InitRule rule,
                        int64_t n) {
  Tensor t = *CpuBackend::Get()->Empty({n}, DType::kF32);
  EXPECT_TRUE(InitializeParameter(CpuBackend::Get(), seed, name, rule, t).ok());
  return ToVector(t);
}

TEST(InitTest, ValuesDependOnlyOnSeedNameAndIndex) {
  const InitRule uniform{InitRule::Kind::kUniform, 0.5};
  auto a = Init(0, "layers.0.weight", uniform, 100);
  EXPECT_EQ(a, Init(0, "layers.0.weight", uniform, 100));
  EXPECT_NE(a, Init(1, "layers.0.weight", uniform, 100));
  EXPECT_NE(a, Init(0, "layers.2.weight", uniform, 100));
  // Element i does not depend on the tensor's size, so no split or shard
  // boundary can change a value.
  auto longer = Init(0, "layers.0.weight", uniform, 300);
  EXPECT_EQ(a, std::vector<float>(longer.begin(), longer.begin() + 100));
}

TEST(InitTest, DistributionsHaveTheRequestedMoments) {
  const int64_t n = 200000;
  auto u = Init(7, "w", {InitRule::Kind::kUniform, 0.25}, n);
  double mean = 0, sq = 0, lo = 1, hi = -1;
  for (float v : u) {
    mean += v;
    sq += v * v;
    lo = std::min<double>(lo, v);
    hi = std::max<double>(hi, v);
  }
  EXPECT_NEAR(mean / n, 0.0, 0.002);
  EXPECT_NEAR(sq / n, 0.25 * 0.25 / 3, 0.001);  // Var of U(-a, a) = a^2 / 3.
  EXPECT_GE(lo, -0.25);
  EXPECT_LT(hi, 0.25);
  auto g = Init(7, "e", {InitRule::Kind::kNormal, 2.0}, n);
  mean = sq = 0;
  for (float v : g) {
    mean += v;
    sq += v * v;
  }
  EXPECT_NEAR(mean / n, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sq / n), 2.0, 0.02);
  EXPECT_EQ(Init(0, "n", {InitRule::Kind::kOnes, 0}, 3),
            (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(Init(0, "n", {InitRule::Kind::kZeros, 0}, 2),
            (std::vector<float>{0, 0}));
}

// Initializing a billion parameters takes tens of seconds: a cancelled job
// stops inside the fill, with the cancel's status.
TEST(InitTest, StopsWhenTheCallingJobIsCancelled) {
  Tensor t = *CpuBackend::Get()->Empty({1000}, DType::kF32);
  const InitRule normal{InitRule::Kind::kNormal, 1.0};
  Cancellation cancellation;
  CancellationScope scope(&cancellation);
  EXPECT_TRUE(InitializeParameter(CpuBackend::Get(), 0, "w", normal, t).ok());
  cancellation.Cancel(absl::CancelledError("job cancelled"));
  EXPECT_EQ(InitializeParameter(CpuBackend::Get(), 0, "w", normal, t),
            absl::CancelledError("job cancelled"));
}

}  // namespace
}  // namespace conveyor::engine
