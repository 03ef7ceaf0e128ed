// Elementwise math for the CPU kernels on short vectors: exp, erf and the
// loads, stores and reductions around them, written with the GCC/Clang vector
// extension so that every lane runs the same straight-line code.
//
// Why not libm in a loop: expf/erff are opaque calls, one element at a time,
// and the compiler will not vectorise a loop with a float comparison in it
// under the default -ftrapping-math. In the GPT training step the scalar erff
// and exp calls took a fifth of the time (docs/performance.md). These
// functions are within 3e-7 relative (Exp) and 6e-7 absolute (Erf),
// which fp32 training cannot tell from libm's.
//
// 4 lanes (16 bytes) is SSE2, which every x86-64 has, and NEON's width on
// ARM: no ABI change between translation units, no runtime dispatch.
//
// Internal to engine/cpu. Pure functions: thread-safe.
#ifndef CONVEYOR_ENGINE_CPU_INTERNAL_VECTOR_MATH_H_
#define CONVEYOR_ENGINE_CPU_INTERNAL_VECTOR_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "engine/cpu/parallel.h"

namespace conveyor::engine::cpu_internal {

inline constexpr int kLanes = 4;
using Vf = float __attribute__((vector_size(16)));
using Vi = int32_t __attribute__((vector_size(16)));
using Vd = double __attribute__((vector_size(16)));  // 2 lanes.

inline Vf Splat(float x) { return Vf{x, x, x, x}; }
inline Vf Load(const float* p) {
  Vf v;
  std::memcpy(&v, p, sizeof(v));  // Unaligned load; no aliasing questions.
  return v;
}
inline void Store(float* p, Vf v) { std::memcpy(p, &v, sizeof(v)); }
// The first n < kLanes elements of p, zeros after; and its inverse.
inline Vf LoadPartial(const float* p, int64_t n) {
  Vf v = Splat(0.0f);
  std::memcpy(&v, p, static_cast<size_t>(n) * sizeof(float));
  return v;
}
inline void StorePartial(float* p, Vf v, int64_t n) {
  std::memcpy(p, &v, static_cast<size_t>(n) * sizeof(float));
}
inline float Sum(Vf v) { return (v[0] + v[1]) + (v[2] + v[3]); }
inline float Max(Vf v) {
  const float a = v[0] > v[1] ? v[0] : v[1];
  const float b = v[2] > v[3] ? v[2] : v[3];
  return a > b ? a : b;
}
inline Vf Sqrt(Vf x) {
#if defined(__SSE__)
  return _mm_sqrt_ps(x);  // Correctly rounded, like std::sqrt per element.
#else
  for (int i = 0; i < kLanes; ++i) x[i] = std::sqrt(x[i]);
  return x;
#endif
}

// A sum of floats in double: two 2-lane accumulators, widened from one
// vector of floats at a time. Rows of a few hundred elements then sum to
// double precision at vector speed.
struct DoubleSum {
  Vd lo = {0.0, 0.0}, hi = {0.0, 0.0};
  void Add(Vf v) {
    lo += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1), Vd);
    hi += __builtin_convertvector(__builtin_shufflevector(v, v, 2, 3), Vd);
  }
  double Total() const { return (lo[0] + lo[1]) + (hi[0] + hi[1]); }
};

inline Vf Min(Vf a, Vf b) { return a < b ? a : b; }
inline Vf MaxV(Vf a, Vf b) { return a > b ? a : b; }

// The largest of scale * x[i] over [0, n); -inf for n = 0. A max is exact in
// any order, so four lanes give the scalar loop's value; the loop's single
// chain of dependent comparisons cost a third of the cross-entropy kernel.
inline float ScaledMax(const float* x, int64_t n, float scale) {
  Vf lanes = Splat(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) lanes = MaxV(lanes, Load(x + i) * scale);
  float max = Max(lanes);
  for (; i < n; ++i) max = std::max(max, scale * x[i]);
  return max;
}

// Wider vectors for the kernels that dispatch on the CPU at run time
// (engine/cpu/wide_kernels.h): AVX2's and AVX-512's widths. Only code
// compiled for those targets may pass them by value.
using Vf8 = float __attribute__((vector_size(32)));
using Vi8 = int32_t __attribute__((vector_size(32)));
using Vf16 = float __attribute__((vector_size(64)));
using Vi16 = int32_t __attribute__((vector_size(64)));

// The int vector of a float vector's lanes.
template <typename V>
struct IntLanes;
template <>
struct IntLanes<Vf> {
  using type = Vi;
};
template <>
struct IntLanes<Vf8> {
  using type = Vi8;
};
template <>
struct IntLanes<Vf16> {
  using type = Vi16;
};

// exp(x), clamped to x in [-87, 88] so the result is a normal float, never
// 0, inf or NaN for finite x (softmax and GELU take exp of values <= 0,
// where the clamp turns an exact 0 into 1.6e-38).
// exp(x) = 2^n exp(r) with n = round(x / ln 2) and |r| <= ln(2) / 2; exp(r)
// by its Taylor series to r^7, whose remainder, (ln 2 / 2)^8 / 8! < 3e-9, is
// below fp32's rounding. Each lane runs the same operations whatever the
// width, so every width gives the same bits (no FMA: engine/CMakeLists.txt
// compiles the wide kernels with -ffp-contract=off).
template <typename V>
[[gnu::always_inline]] inline V ExpT(V x) {
  constexpr float kLog2e = 1.44269504088896341f;
  // ln 2 split so that n * kLn2Hi is exact for |n| < 2^10 (Cody and Waite).
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  // Adding 1.5 * 2^23 rounds a float of magnitude < 2^22 to an integer.
  constexpr float kRound = 12582912.0f;
  const V hi = V{} + 88.0f, lo = V{} - 87.0f;
  x = x < hi ? x : hi;
  x = x > lo ? x : lo;
  const V n = (x * kLog2e + kRound) - kRound;
  const V r = (x - n * kLn2Hi) - n * kLn2Lo;
  V p = V{} + 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n built in the exponent field; n is in [-126, 127], a normal float.
  using I = typename IntLanes<V>::type;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// erf(x), and exp(-x^2) in *gauss, which GELU's derivative needs as well.
// Abramowitz and Stegun 7.1.26: erf(|x|) = 1 - t P(t) exp(-x^2) with
// t = 1 / (1 + p |x|), absolute error <= 1.5e-7 in exact arithmetic.
template <typename V>
[[gnu::always_inline]] inline V ErfT(V x, V* gauss) {
  constexpr float kP = 0.3275911f;
  constexpr float kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f,
                  kA4 = -1.453152027f, kA5 = 1.061405429f;
  const V ax = x < 0.0f ? -x : x;
  const V t = 1.0f / (1.0f + kP * ax);
  const V poly = t * (kA1 + t * (kA2 + t * (kA3 + t * (kA4 + t * kA5))));
  *gauss = ExpT(-x * x);
  const V e = 1.0f - poly * *gauss;
  return x < 0.0f ? -e : e;
}

inline Vf Exp(Vf x) { return ExpT(x); }
inline Vf Erf(Vf x, Vf* gauss) { return ErfT(x, gauss); }

// Runs f(Vf) -> Vf over n floats of x into y, the tail through a zero-padded
// vector. Lanes are independent, so the result does not depend on where the
// tail starts.
template <typename F>
inline void MapUnary(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store(y + i, f(Load(x + i)));
  if (i < n) StorePartial(y + i, f(LoadPartial(x + i, n - i)), n - i);
}

// Runs f(Vf a, Vf b) -> Vf over n floats of a and b into y.
template <typename F>
inline void MapBinary(const float* a, const float* b, float* y, int64_t n,
                      F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Store(y + i, f(Load(a + i), Load(b + i)));
  }
  if (i < n) {
    StorePartial(y + i, f(LoadPartial(a + i, n - i), LoadPartial(b + i, n - i)),
                 n - i);
  }
}

// chunk(begin, end) over [0, n): inline for small n, else split across the
// pool like ParallelFor, but each part gets a whole range, so its loop can
// run over vectors.
template <typename Chunk>
inline void ForChunks(int64_t n, Chunk chunk) {
  if (n < kParallelGrain) {
    if (n > 0) chunk(int64_t{0}, n);
    return;
  }
  ParallelChunks(n, chunk);
}

// n zeroed doubles in a buffer owned by the calling thread and reused by its
// next call, so reductions allocate nothing in a steady-state step. Valid
// until this thread calls Scratch again.
inline double* Scratch(int64_t n) {
  thread_local std::vector<double> buffer;
  buffer.assign(static_cast<size_t>(n), 0.0);
  return buffer.data();
}

// band(begin, end) over column bands of a [rows, cols] reduction: one band
// when the whole is too small to split. A band walks every row in order, so
// each column's sum is the same however the columns are split.
template <typename Band>
inline void ForColumnBands(int64_t rows, int64_t cols, Band band) {
  int64_t cost = 0;
  if (cols < 2 ||
      (!__builtin_mul_overflow(rows, cols, &cost) && cost < kParallelGrain)) {
    if (cols > 0) band(int64_t{0}, cols);
    return;
  }
  ParallelChunks(cols, band);
}

}  // namespace conveyor::engine::cpu_internal

#endif  // CONVEYOR_ENGINE_CPU_INTERNAL_VECTOR_MATH_H_
