#include "engine/cpu/wide_kernels.h"

// Vectors wider than the baseline are passed only inside functions compiled
// for their target; GCC's note about the ABI of such arguments does not
// apply to these always-inlined templates (vector_math.h's among them).
#pragma GCC diagnostic ignored "-Wpsabi"

#include <cstring>

#include "engine/cpu/internal/vector_math.h"

namespace conveyor::engine::cpu_internal {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kGeluCubic = 0.044715f;

// tanh(z) = 1 - 2 / (exp(2z) + 1): saturates to +-1 through Exp's clamp.
template <typename V>
[[gnu::always_inline]] inline V Tanh(V z) {
  return 1.0f - 2.0f / (ExpT(2.0f * z) + 1.0f);
}

// GELU and its derivative on one vector. The exact form's derivative reuses
// the Gaussian that Erf computes, so it costs one Exp per element, as the
// forward does.
template <typename V>
[[gnu::always_inline]] inline V Gelu(V v, bool tanh) {
  if (tanh) {
    return 0.5f * v *
           (1.0f + Tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
  }
  V gauss;
  return 0.5f * v * (1.0f + ErfT(v * kInvSqrt2, &gauss));
}

template <typename V>
[[gnu::always_inline]] inline V GeluDerivative(V v, bool tanh) {
  if (tanh) {
    const V t = Tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const V dt =
        (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    return 0.5f * (1.0f + t) + 0.5f * v * dt;
  }
  // d/dv [v Phi(v)] = Phi(v) + v phi(v); Erf hands back exp(-v^2 / 2).
  V gauss;
  const V cdf = 0.5f * (1.0f + ErfT(v * kInvSqrt2, &gauss));
  return cdf + v * (kInvSqrt2Pi * gauss);
}

template <typename V>
[[gnu::always_inline]] inline V LoadV(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename V>
[[gnu::always_inline]] inline void StoreV(float* p, V v) {
  std::memcpy(p, &v, sizeof(v));
}

// The loops over whole vectors of V; each returns where it stopped, and the
// 4-lane loops below finish the rest (lanes are independent, so where the
// split falls does not change a bit).
template <typename V>
[[gnu::always_inline]] inline int64_t GeluForwardBody(const float* x, float* y,
                                                      int64_t n, bool tanh) {
  constexpr int64_t kN = sizeof(V) / sizeof(float);
  int64_t i = 0;
  for (; i + kN <= n; i += kN) StoreV(y + i, Gelu(LoadV<V>(x + i), tanh));
  return i;
}

template <typename V>
[[gnu::always_inline]] inline int64_t GeluBackwardBody(const float* x,
                                                       const float* dy,
                                                       float* dx, int64_t n,
                                                       bool tanh) {
  constexpr int64_t kN = sizeof(V) / sizeof(float);
  int64_t i = 0;
  for (; i + kN <= n; i += kN) {
    StoreV(dx + i, LoadV<V>(dy + i) * GeluDerivative(LoadV<V>(x + i), tanh));
  }
  return i;
}

template <typename V>
[[gnu::always_inline]] inline int64_t ExpShiftedBody(float* x, int64_t n,
                                                     float shift) {
  constexpr int64_t kN = sizeof(V) / sizeof(float);
  int64_t i = 0;
  for (; i + kN <= n; i += kN) StoreV(x + i, ExpT(LoadV<V>(x + i) - shift));
  return i;
}

#if defined(__x86_64__)
#define CONVEYOR_WIDE_TARGETS 1
[[gnu::target("avx2")]] int64_t GeluForward8(const float* x, float* y,
                                             int64_t n, bool tanh) {
  return GeluForwardBody<Vf8>(x, y, n, tanh);
}
[[gnu::target("avx512f")]] int64_t GeluForward16(const float* x, float* y,
                                                 int64_t n, bool tanh) {
  return GeluForwardBody<Vf16>(x, y, n, tanh);
}
[[gnu::target("avx2")]] int64_t GeluBackward8(const float* x, const float* dy,
                                              float* dx, int64_t n, bool tanh) {
  return GeluBackwardBody<Vf8>(x, dy, dx, n, tanh);
}
[[gnu::target("avx512f")]] int64_t GeluBackward16(const float* x,
                                                  const float* dy, float* dx,
                                                  int64_t n, bool tanh) {
  return GeluBackwardBody<Vf16>(x, dy, dx, n, tanh);
}
[[gnu::target("avx2")]] int64_t ExpShifted8(float* x, int64_t n, float shift) {
  return ExpShiftedBody<Vf8>(x, n, shift);
}
[[gnu::target("avx512f")]] int64_t ExpShifted16(float* x, int64_t n,
                                                float shift) {
  return ExpShiftedBody<Vf16>(x, n, shift);
}
#endif

}  // namespace

Width WidestWidth() {
#if defined(CONVEYOR_WIDE_TARGETS)
  static const Width widest = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Width::k16;
    if (__builtin_cpu_supports("avx2")) return Width::k8;
    return Width::k4;
  }();
  return widest;
#else
  return Width::k4;
#endif
}

void GeluForward(const float* x, float* y, int64_t n, bool tanh, Width width) {
  int64_t done = 0;
#if defined(CONVEYOR_WIDE_TARGETS)
  if (width == Width::k16) done = GeluForward16(x, y, n, tanh);
  if (width == Width::k8) done = GeluForward8(x, y, n, tanh);
#endif
  MapUnary(x + done, y + done, n - done, [=](Vf v) { return Gelu(v, tanh); });
}

void GeluBackward(const float* x, const float* dy, float* dx, int64_t n,
                  bool tanh, Width width) {
  int64_t done = 0;
#if defined(CONVEYOR_WIDE_TARGETS)
  if (width == Width::k16) done = GeluBackward16(x, dy, dx, n, tanh);
  if (width == Width::k8) done = GeluBackward8(x, dy, dx, n, tanh);
#endif
  MapBinary(x + done, dy + done, dx + done, n - done,
            [=](Vf v, Vf g) { return g * GeluDerivative(v, tanh); });
}

void ExpShifted(float* x, int64_t n, float shift, Width width) {
  int64_t done = 0;
#if defined(CONVEYOR_WIDE_TARGETS)
  if (width == Width::k16) done = ExpShifted16(x, n, shift);
  if (width == Width::k8) done = ExpShifted8(x, n, shift);
#endif
  MapUnary(x + done, x + done, n - done, [=](Vf v) { return ExpT(v - shift); });
}

}  // namespace conveyor::engine::cpu_internal
