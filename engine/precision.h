// Precision: how a job's GEMMs round their inputs (`training.precision`).
//
//   fp32  full fp32 GEMMs (the default; CPU and CUDA agree to rounding).
//   bf16  mixed precision: GEMM inputs are rounded to bfloat16 (8-bit
//         mantissa, round to nearest even) and multiplied with fp32
//         accumulation into fp32 outputs, on a GPU's bf16 tensor cores.
//         Parameters (the master weights), optimizer state, activations
//         between layers and every other kernel (norms, softmax, losses,
//         updates) stay fp32, so only the GEMMs lose precision, as with
//         autocast in PyTorch.
//
// The CPU backend emulates bf16 by rounding copies of the inputs before its
// fp32 SGEMM: the numerical reference for the CUDA backend's bf16 GEMMs (the
// products of bf16 values are exact in fp32, so the two differ only in
// accumulation order).
#ifndef CONVEYOR_ENGINE_PRECISION_H_
#define CONVEYOR_ENGINE_PRECISION_H_

#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace conveyor::engine {

enum class Precision : uint8_t { kFp32 = 0, kBf16 = 1 };

// "fp32", "bf16".
absl::string_view PrecisionName(Precision precision);

// The names, in enum order, for parsers and their errors.
inline constexpr absl::string_view kPrecisionNames[] = {"fp32", "bf16"};

// `x` rounded to the nearest bfloat16 value (ties to even), as a float.
// NaN stays NaN (quiet); values past the largest bf16 round to infinity.
inline float RoundToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    bits |= 0x00400000u;  // Keep NaN a (quiet) NaN after truncation.
  } else {
    bits += 0x7fffu + ((bits >> 16) & 1u);
  }
  bits &= 0xffff0000u;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_PRECISION_H_
