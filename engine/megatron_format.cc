#include "engine/megatron_format.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace conveyor::engine {

absl::StatusOr<MegatronDType> MegatronDTypeFromCode(int code) {
  if (code < 1 || code > 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown Megatron dtype code ", code,
        "; known: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 "
        "float32, 8 uint16"));
  }
  return static_cast<MegatronDType>(code);
}

absl::string_view MegatronDTypeName(MegatronDType dtype) {
  switch (dtype) {
    case MegatronDType::kUint8:
      return "uint8";
    case MegatronDType::kInt8:
      return "int8";
    case MegatronDType::kInt16:
      return "int16";
    case MegatronDType::kInt32:
      return "int32";
    case MegatronDType::kInt64:
      return "int64";
    case MegatronDType::kFloat64:
      return "float64";
    case MegatronDType::kFloat32:
      return "float32";
    case MegatronDType::kUint16:
      return "uint16";
  }
  return "unknown";
}

absl::StatusOr<MegatronDType> ParseMegatronDType(absl::string_view name) {
  for (int code = 1; code <= 8; ++code) {
    const auto dtype = static_cast<MegatronDType>(code);
    if (MegatronDTypeName(dtype) == name) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown Megatron dtype '", name,
                   "'; allowed: uint8, int8, int16, int32, int64, uint16 "
                   "(float32 and float64 cannot hold token ids)"));
}

int MegatronDTypeBytes(MegatronDType dtype) {
  switch (dtype) {
    case MegatronDType::kUint8:
    case MegatronDType::kInt8:
      return 1;
    case MegatronDType::kInt16:
    case MegatronDType::kUint16:
      return 2;
    case MegatronDType::kInt32:
    case MegatronDType::kFloat32:
      return 4;
    case MegatronDType::kInt64:
    case MegatronDType::kFloat64:
      return 8;
  }
  return 1;
}

bool IsIntegerMegatronDType(MegatronDType dtype) {
  return dtype != MegatronDType::kFloat32 && dtype != MegatronDType::kFloat64;
}

uint64_t MegatronDTypeIdLimit(MegatronDType dtype) {
  switch (dtype) {
    case MegatronDType::kUint8:
      return uint64_t{1} << 8;
    case MegatronDType::kInt8:
      return uint64_t{1} << 7;
    case MegatronDType::kInt16:
      return uint64_t{1} << 15;
    case MegatronDType::kUint16:
      return uint64_t{1} << 16;
    case MegatronDType::kInt32:
      return uint64_t{1} << 31;
    case MegatronDType::kInt64:
      return uint64_t{1} << 63;
    case MegatronDType::kFloat32:
    case MegatronDType::kFloat64:
      return 0;
  }
  return 0;
}

std::string MegatronBinPath(absl::string_view prefix) {
  return absl::StrCat(prefix, ".bin");
}

std::string MegatronIdxPath(absl::string_view prefix) {
  return absl::StrCat(prefix, ".idx");
}

MegatronDType MegatronDTypeForVocab(int64_t vocab_size) {
  return vocab_size <= (int64_t{1} << 16) ? MegatronDType::kUint16
                                          : MegatronDType::kInt32;
}

}  // namespace conveyor::engine
