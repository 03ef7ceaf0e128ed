// Elementwise CPU kernels on the widest float vectors the machine has:
// AVX-512 (16 lanes) or AVX2 (8) where the CPU reports them at run time,
// else the 4 lanes of vector_math.h, which every x86-64 and ARM64 has. The
// binary stays portable (no -march flag); only these loops get wider code.
//
// Every width runs the same IEEE operations on each lane, without FMA
// contraction, so all widths give the same bits: a job's results do not
// depend on which of these the CPU has (tests check it).
//
// Why: GELU's erf and exp were 15% of the byte-level GPT's step on one core
// at 4 lanes; PyTorch vectorises them at the CPU's full width.
//
// Pure functions: thread-safe.
#ifndef CONVEYOR_ENGINE_CPU_WIDE_KERNELS_H_
#define CONVEYOR_ENGINE_CPU_WIDE_KERNELS_H_

#include <cstdint>

namespace conveyor::engine::cpu_internal {

// Lanes per vector: 4, 8 or 16.
enum class Width : int { k4 = 4, k8 = 8, k16 = 16 };

// The widest the CPU runs (checked once).
Width WidestWidth();

// y = GELU(x) (exact or tanh form, as torch.nn.GELU) over n floats.
void GeluForward(const float* x, float* y, int64_t n, bool tanh,
                 Width width = WidestWidth());
// dx = dy * GELU'(x) over n floats.
void GeluBackward(const float* x, const float* dy, float* dx, int64_t n,
                  bool tanh, Width width = WidestWidth());
// x[i] = exp(x[i] - shift) (vector_math.h's Exp) over n floats.
void ExpShifted(float* x, int64_t n, float shift, Width width = WidestWidth());

}  // namespace conveyor::engine::cpu_internal

#endif  // CONVEYOR_ENGINE_CPU_WIDE_KERNELS_H_
