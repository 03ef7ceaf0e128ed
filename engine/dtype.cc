#include "engine/dtype.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"

namespace conveyor::engine {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 13> kDTypes = {{
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI64, "I64", 8},
    {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},
    {DType::kU16, "U16", 2},
    {DType::kU32, "U32", 4},
    {DType::kU64, "U64", 8},
    {DType::kBool, "BOOL", 1},
}};

const DTypeInfo& Info(DType dtype) {
  return kDTypes[static_cast<size_t>(dtype)];
}

}  // namespace

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name,
      "'; allowed: F32, F64, F16, BF16, I64, I32, I16, I8, U8, U16, U32, U64, "
      "BOOL"));
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

}  // namespace conveyor::engine
