// Helpers shared by the engine tests: tensors from host vectors and back,
// seeded random fills, and closeness checks.
#ifndef CONVEYOR_TESTS_ENGINE_TEST_UTIL_H_
#define CONVEYOR_TESTS_ENGINE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/tensor.h"
#include "gtest/gtest.h"

namespace conveyor::engine::testing_util {

inline Tensor FromVector(const Shape& shape, const std::vector<float>& v) {
  Tensor t = *CpuBackend::Get()->Empty(shape, DType::kF32);
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  EXPECT_TRUE(CpuBackend::Get()->CopyFromHost(v.data(), v.size() * 4, t).ok());
  return t;
}

inline Tensor Ids(const Shape& shape, const std::vector<int64_t>& v) {
  Tensor t = *CpuBackend::Get()->Empty(shape, DType::kI64);
  EXPECT_TRUE(CpuBackend::Get()->CopyFromHost(v.data(), v.size() * 8, t).ok());
  return t;
}

inline std::vector<float> ToVector(const Tensor& t) {
  std::vector<float> v(t.numel());
  EXPECT_TRUE(CpuBackend::Get()->CopyToHost(t, v.data(), v.size() * 4).ok());
  return v;
}

inline std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline Tensor RandomTensor(const Shape& shape, uint32_t seed,
                           float scale = 1.0f) {
  return FromVector(shape, Random(NumElements(shape), seed, scale));
}

inline Tensor ZerosLike(const Tensor& t) {
  return *CpuBackend::Get()->Zeros(t.shape(), t.dtype());
}

// |a - b| <= atol + rtol * |b| elementwise, reporting the first failure.
inline ::testing::AssertionResult AllClose(const std::vector<float>& a,
                                           const std::vector<float>& b,
                                           double rtol, double atol) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(a[i] - b[i]) <= atol + rtol * std::abs(b[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Tensors of the same shape close within rtol relative, with an absolute
// floor of rtol times want's largest magnitude: sums in another order cost
// a few ulps of the largest terms, not of an element that cancels to near
// zero. Reads tensors of any host-readable backend.
inline ::testing::AssertionResult CloseToScale(const Tensor& got,
                                               const Tensor& want,
                                               double rtol) {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure()
           << ShapeString(got.shape()) << " vs " << ShapeString(want.shape());
  }
  auto read = [](const Tensor& t) {
    std::vector<float> v(t.numel());
    EXPECT_TRUE(t.backend()->CopyToHost(t, v.data(), v.size() * 4).ok());
    return v;
  };
  const std::vector<float> a = read(got), b = read(want);
  float scale = 0;
  for (float x : b) scale = std::max(scale, std::abs(x));
  return AllClose(a, b, rtol, rtol * scale + 1e-12);
}

}  // namespace conveyor::engine::testing_util

#endif  // CONVEYOR_TESTS_ENGINE_TEST_UTIL_H_
