// The AVX2 and AVX-512 loops give the 4-lane loop's bits, so a job's results
// do not depend on the CPU it runs on. Widths the CPU lacks are skipped.
#include "engine/cpu/wide_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine::cpu_internal {
namespace {

// Random values across GELU's and exp's ranges, extremes included; an odd
// length so every width leaves a tail for the 4-lane loop.
std::vector<float> Inputs() {
  std::vector<float> x = testing_util::Random(1003, 17, 4.0f);
  const float extremes[] = {0.0f,  -0.0f,  1e-30f, -1e-30f, 9.0f,
                            -9.0f, 87.5f,  -87.5f, 100.0f,  -100.0f,
                            1e30f, -1e30f, 3e38f,  -3e38f,  1e-40f};
  for (size_t i = 0; i < std::size(extremes); ++i) x[i * 7] = extremes[i];
  return x;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<Width> Widths() {
  std::vector<Width> widths = {Width::k4};
  if (WidestWidth() == Width::k8 || WidestWidth() == Width::k16) {
    widths.push_back(Width::k8);
  }
  if (WidestWidth() == Width::k16) widths.push_back(Width::k16);
  return widths;
}

TEST(WideKernelsTest, EveryWidthGivesTheFourLaneBits) {
  if (Widths().size() == 1) GTEST_SKIP() << "this CPU has no AVX2";
  const std::vector<float> x = Inputs();
  const std::vector<float> dy = testing_util::Random(x.size(), 18);
  const int64_t n = static_cast<int64_t>(x.size());
  for (bool tanh : {false, true}) {
    std::vector<float> ref_y(n), ref_dx(n);
    GeluForward(x.data(), ref_y.data(), n, tanh, Width::k4);
    GeluBackward(x.data(), dy.data(), ref_dx.data(), n, tanh, Width::k4);
    std::vector<float> ref_exp = x;
    ExpShifted(ref_exp.data(), n, 1.5f, Width::k4);
    for (Width w : Widths()) {
      SCOPED_TRACE(static_cast<int>(w));
      std::vector<float> y(n), dx(n), e = x;
      GeluForward(x.data(), y.data(), n, tanh, w);
      GeluBackward(x.data(), dy.data(), dx.data(), n, tanh, w);
      ExpShifted(e.data(), n, 1.5f, w);
      EXPECT_TRUE(SameBits(y, ref_y)) << "tanh " << tanh;
      EXPECT_TRUE(SameBits(dx, ref_dx)) << "tanh " << tanh;
      EXPECT_TRUE(SameBits(e, ref_exp));
    }
  }
}

// The dispatched kernels compute GELU: against libm in double, within the
// erf approximation's 6e-7 absolute (times |x|) plus fp32 rounding.
TEST(WideKernelsTest, GeluMatchesTheDoubleFormula) {
  const std::vector<float> x = testing_util::Random(1001, 3, 3.0f);
  std::vector<float> y(x.size());
  GeluForward(x.data(), y.data(), static_cast<int64_t>(x.size()), false);
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double want = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    EXPECT_NEAR(y[i], want, 1e-6 * (1.0 + std::fabs(v))) << v;
  }
}

}  // namespace
}  // namespace conveyor::engine::cpu_internal
