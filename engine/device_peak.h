// The dense peak FLOP/s of a GPU's GEMMs, from its compute capability, SM
// count and clock: the denominator of model FLOPs utilisation (MFU,
// docs/metrics.md) when the operator gives no --peak-tflops.
//
// Per SM and clock cycle, at the precision Conveyor's GEMMs run in
// (engine/precision.h):
//   fp32  FFMA on the CUDA cores (2 FLOPs per core): the CUDA backend asks
//         cuBLAS for CUBLAS_COMPUTE_32F without TF32, so no tensor cores.
//   bf16  dense tensor-core MMA with fp32 accumulation (no sparsity).
// Multiplied by the SM count and the clock the device reports (its maximum
// boost clock), this reproduces NVIDIA's datasheet figures: A100 108 SMs x
// 1.41 GHz x 2048 = 312 TFLOP/s bf16; H100 SXM 132 x 1.98 GHz x 256 = 67
// TFLOP/s fp32. NVIDIA's dense bf16 figure for H100 SXM (989 TFLOP/s) is
// quoted at 1.83 GHz, so ours is 8% higher there: MFU errs low, never high.
//
// Plain arithmetic with no CUDA dependency, so it is tested on any machine.
#ifndef CONVEYOR_ENGINE_DEVICE_PEAK_H_
#define CONVEYOR_ENGINE_DEVICE_PEAK_H_

#include "engine/precision.h"

namespace conveyor::engine {

struct GpuComputeUnits {
  int compute_major = 0;  // Compute capability, e.g. 9.0 for Hopper.
  int compute_minor = 0;
  int multiprocessors = 0;  // SM count.
  double clock_khz = 0;     // Maximum SM clock (cudaDevAttrClockRate).
};

// FLOPs one SM retires per clock cycle for `precision`'s GEMMs; 0 where the
// architecture is not in the table (or has no bf16 tensor cores: before
// sm_80), so that an unknown device reports no MFU rather than a wrong one.
double FlopsPerSmPerClock(int compute_major, int compute_minor,
                          Precision precision);

// multiprocessors x clock x FlopsPerSmPerClock; 0 when any factor is
// unknown or not positive.
double GpuPeakFlops(const GpuComputeUnits& units, Precision precision);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_DEVICE_PEAK_H_
