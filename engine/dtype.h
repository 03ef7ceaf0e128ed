// Element types of tensors. f32 is the compute type on CPU; bf16 and f16 are
// storage and GPU compute types; the integer types carry token ids and come
// from data files. Names match the safetensors format. Thread-safe.
#ifndef CONVEYOR_ENGINE_DTYPE_H_
#define CONVEYOR_ENGINE_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::engine {

enum class DType : unsigned char {
  kF32,
  kF64,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kU16,
  kU32,
  kU64,
  kBool,
};

// Bytes per element.
size_t DTypeSize(DType dtype);

// The safetensors name: "F32", "BF16", "I64", "U8", "BOOL", ...
absl::string_view DTypeName(DType dtype);

// Inverse of DTypeName. InvalidArgument lists the allowed names.
absl::StatusOr<DType> ParseDType(absl::string_view name);

bool IsFloatingPoint(DType dtype);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_DTYPE_H_
