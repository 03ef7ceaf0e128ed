#include "engine/device_peak.h"

#include <cmath>

namespace conveyor::engine {

double FlopsPerSmPerClock(int compute_major, int compute_minor,
                          Precision precision) {
  const int cc = 10 * compute_major + compute_minor;
  switch (precision) {
    case Precision::kFp32:
      // 64 FP32 cores per SM (128 FLOPs) on sm_60, sm_70, sm_75 and sm_80;
      // 128 (256 FLOPs) on sm_61 and from sm_86 on, Hopper and Blackwell
      // included.
      switch (cc) {
        case 60:
        case 70:
        case 72:
        case 75:
        case 80:
          return 128;
        case 61:
        case 62:
        case 86:
        case 87:
        case 89:
        case 90:
        case 100:
        case 103:
        case 120:
          return 256;
        default:
          return 0;
      }
    case Precision::kBf16:
      // Dense bf16 with fp32 accumulation. Turing and Volta have no bf16
      // tensor cores; the consumer and workstation parts of Ampere and Ada
      // (sm_86, sm_89) run a quarter of the data-centre SM's rate.
      switch (cc) {
        case 80:
          return 2048;
        case 86:
        case 87:
        case 89:
          return 1024;
        case 90:
          return 4096;
        case 100:
        case 103:
          return 8192;
        default:
          return 0;
      }
  }
  return 0;
}

double GpuPeakFlops(const GpuComputeUnits& units, Precision precision) {
  const double per_clock =
      FlopsPerSmPerClock(units.compute_major, units.compute_minor, precision);
  if (!(per_clock > 0) || units.multiprocessors <= 0 ||
      !(units.clock_khz > 0) || !std::isfinite(units.clock_khz)) {
    return 0;
  }
  return per_clock * units.multiprocessors * units.clock_khz * 1e3;
}

}  // namespace conveyor::engine
