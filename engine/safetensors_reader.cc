// SafetensorsReader (engine/safetensors.h): validates a whole file held in
// memory against the format, treating it as untrusted, and converts its
// tensors to float or int64 on request.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "engine/internal/safetensors_format.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"

namespace conveyor::engine {
namespace {

using safetensors_internal::CheckedByteSize;
using safetensors_internal::CheckedNumel;
using safetensors_internal::kLengthPrefixBytes;
using safetensors_internal::kMaxHeaderBytes;
using safetensors_internal::kMetadataKey;
using safetensors_internal::ShapeString;

using Json = nlohmann::json;

template <typename... Args>
absl::Status Invalid(absl::string_view source, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", args...));
}

// Parses the header JSON strictly (common/strict_json.h): a duplicate key
// would let two entries claim one name, and one of them escape validation.
// A header is three levels deep (tensors, their fields, shapes and offsets).
absl::StatusOr<Json> ParseHeaderJson(absl::string_view source,
                                     std::string_view text) {
  absl::StatusOr<Json> header =
      ParseStrictJson(absl::string_view(text.data(), text.size()), "header",
                      {.max_depth = 8, .top_level_key = "tensor name"});
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(source, ": ", header.status().message()));
  }
  return header;
}

absl::Status ParseMetadata(absl::string_view source, const Json& value,
                           std::map<std::string, std::string>* metadata) {
  // The reference reader types this as Option<HashMap<String, String>>, so
  // null means "none".
  if (value.is_null()) return absl::OkStatus();
  if (!value.is_object()) {
    return Invalid(source, "__metadata__ must be an object, got ",
                   value.type_name());
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return Invalid(source, "__metadata__ value for '", key,
                     "' must be a string, got ", item.type_name());
    }
    (*metadata)[key] = item.get_ref<const std::string&>();
  }
  return absl::OkStatus();
}

// One header entry, checked on its own; offsets against the buffer are
// checked by the caller.
absl::StatusOr<TensorInfo> ParseTensorEntry(absl::string_view source,
                                            const std::string& name,
                                            const Json& entry) {
  const std::string where = absl::StrCat(source, ": tensor '", name, "'");
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": entry must be an object, got ", entry.type_name()));
  }
  // Unknown fields are most likely a misspelling or another format; either
  // way the file is not what we think it is.
  for (const auto& [key, unused] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown field '", key, "'"));
    }
  }
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"dtype\" must be a string"));
  }
  absl::StatusOr<DType> dtype =
      ParseDType(dtype_it->get_ref<const std::string&>());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", dtype.status().message()));
  }
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"shape\" must be an array"));
  }
  size_t index = 0;
  for (const Json& dim : *shape_it) {
    // Non-negative JSON integers parse as number_unsigned; negative ones and
    // fractions do not. The message names the element's index and type, and
    // never dumps it: dump() recurses once per nesting level, and a hostile
    // header nested millions deep would overflow the stack.
    if (!dim.is_number_unsigned() ||
        dim.get<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape[", index, "] ",
          dim.is_number_integer()
              ? std::string("is out of range")
              : absl::StrCat("has JSON type ", dim.type_name()),
          "; the shape must hold non-negative integers below 2^63"));
    }
    ++index;
    info.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() ||
      offsets_it->size() != 2 || !(*offsets_it)[0].is_number_unsigned() ||
      !(*offsets_it)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": \"data_offsets\" must be [begin, end] with non-negative "
        "integers"));
  }
  info.begin = (*offsets_it)[0].get<uint64_t>();
  info.end = (*offsets_it)[1].get<uint64_t>();
  if (info.begin > info.end) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": data_offsets [",
                                                   info.begin, ", ", info.end,
                                                   "] end before they begin"));
  }
  return info;
}

// IEEE binary16 -> binary32; exact, since every half value is a float.
float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1Fu;
  const uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, a normal float (or zero).
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  uint32_t bits;
  if (exponent == 0x1F) {
    // Inf, or NaN with its payload kept.
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    // Rebias the exponent from 15 to 127.
    bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

// bfloat16 is the top half of a binary32.
float BFloat16ToFloat(uint16_t bf16) {
  return std::bit_cast<float>(static_cast<uint32_t>(bf16) << 16);
}

// IEEE conversion, round to nearest even. C++ leaves out-of-range
// double -> float conversion undefined (hardware gives inf), so the overflow
// is spelled out: from FLT_MAX plus half an ulp on, values round to infinity.
float DoubleToFloat(double value) {
  constexpr double kRoundsToInfinity = 0x1.ffffffp127;
  if (value >= kRoundsToInfinity) {
    return std::numeric_limits<float>::infinity();
  }
  if (value <= -kRoundsToInfinity) {
    return -std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(value);
}

// Element `i` of `raw` as a T. The data buffer is not aligned for T in
// general, hence memcpy.
template <typename T>
T Load(std::span<const uint8_t> raw, size_t i) {
  T value;
  std::memcpy(&value, raw.data() + i * sizeof(T), sizeof(T));
  return value;
}

template <typename T, typename Out, typename Convert>
std::vector<Out> ConvertAll(std::span<const uint8_t> raw, Convert convert) {
  const size_t n = raw.size() / sizeof(T);
  std::vector<Out> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = convert(Load<T>(raw, i));
  return out;
}

template <typename T>
std::vector<int64_t> WidenAll(std::span<const uint8_t> raw) {
  return ConvertAll<T, int64_t>(raw,
                                [](T v) { return static_cast<int64_t>(v); });
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 0;
  CheckedNumel(shape, &n);
  return n;
}

// ---------------------------------------------------------------------------
// SafetensorsReader

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return FromBytes(std::move(bytes), path);
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::FromBytes(
    std::string bytes, std::string source_name) {
  const absl::string_view source = source_name;
  if (bytes.size() < kLengthPrefixBytes) {
    return Invalid(source, "file is ", bytes.size(),
                   " bytes, too short for the 8-byte header size");
  }
  uint64_t header_size = 0;
  for (size_t i = 0; i < kLengthPrefixBytes; ++i) {
    header_size |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i]))
                   << (8 * i);
  }
  const uint64_t after_prefix = bytes.size() - kLengthPrefixBytes;
  if (header_size > kMaxHeaderBytes) {
    return Invalid(source, "header size ", header_size,
                   " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  }
  if (header_size > after_prefix) {
    return Invalid(source, "header size ", header_size, " exceeds the ",
                   after_prefix, " bytes after the size field (truncated?)");
  }
  const uint64_t data_start = kLengthPrefixBytes + header_size;
  const uint64_t data_size = bytes.size() - data_start;

  ASSIGN_OR_RETURN(
      Json header,
      ParseHeaderJson(
          source,
          std::string_view(bytes.data() + kLengthPrefixBytes, header_size)));
  if (!header.is_object()) {
    return Invalid(source, "header must be a JSON object, got ",
                   header.type_name());
  }

  SafetensorsReader reader;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      RETURN_IF_ERROR(ParseMetadata(source, value, &reader.metadata_));
      continue;
    }
    ASSIGN_OR_RETURN(TensorInfo info, ParseTensorEntry(source, key, value));
    if (info.end > data_size) {
      return Invalid(source, "tensor '", info.name, "': data_offsets [",
                     info.begin, ", ", info.end, "] exceed the data buffer of ",
                     data_size, " bytes (truncated?)");
    }
    uint64_t needed = 0;
    if (!CheckedByteSize(info.dtype, info.shape, &needed)) {
      return Invalid(source, "tensor '", info.name, "': shape ",
                     ShapeString(info.shape),
                     " has more elements than fit in 64 bits");
    }
    if (needed != info.bytes()) {
      return Invalid(source, "tensor '", info.name, "': data_offsets [",
                     info.begin, ", ", info.end, "] hold ", info.bytes(),
                     " bytes but ", DTypeName(info.dtype), " ",
                     ShapeString(info.shape), " needs ", needed);
    }
    reader.tensors_.push_back(std::move(info));
  }

  // The format forbids holes and overlaps: in offset order each tensor must
  // start where the previous one ended, and the last end at the buffer's end.
  std::sort(reader.tensors_.begin(), reader.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              if (a.begin != b.begin) return a.begin < b.begin;
              if (a.end != b.end) return a.end < b.end;
              return a.name < b.name;
            });
  uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : reader.tensors_) {
    if (t.begin < covered) {
      return Invalid(source, "tensor '", t.name, "': data_offsets [", t.begin,
                     ", ", t.end, "] overlap tensor '", previous->name, "' [",
                     previous->begin, ", ", previous->end, "]");
    }
    if (t.begin > covered) {
      return Invalid(source, "bytes [", covered, ", ", t.begin,
                     ") of the data buffer belong to no tensor (before '",
                     t.name, "')");
    }
    covered = t.end;
    previous = &t;
  }
  if (covered != data_size) {
    return Invalid(source, "data buffer is ", data_size,
                   " bytes but the tensors cover only ", covered);
  }

  for (size_t i = 0; i < reader.tensors_.size(); ++i) {
    reader.index_.emplace(reader.tensors_[i].name, i);
  }
  reader.data_start_ = data_start;
  reader.bytes_ = std::move(bytes);
  reader.source_name_ = std::move(source_name);
  return reader;
}

const TensorInfo* SafetensorsReader::Find(absl::string_view name) const {
  auto it = index_.find(std::string_view(name.data(), name.size()));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const TensorInfo*> SafetensorsReader::FindOrError(
    absl::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(source_name_, ": no tensor '", name, "'"));
  }
  return info;
}

std::span<const uint8_t> SafetensorsReader::RawBytes(
    const TensorInfo& info) const {
  // Offsets were validated against the buffer in FromBytes.
  return std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(bytes_.data()) + data_start_ +
          info.begin,
      info.bytes());
}

absl::StatusOr<std::span<const uint8_t>> SafetensorsReader::RawBytes(
    absl::string_view name) const {
  ASSIGN_OR_RETURN(const TensorInfo* info, FindOrError(name));
  return RawBytes(*info);
}

absl::StatusOr<std::vector<float>> SafetensorsReader::ReadF32(
    absl::string_view name) const {
  ASSIGN_OR_RETURN(const TensorInfo* info, FindOrError(name));
  const std::span<const uint8_t> raw = RawBytes(*info);
  switch (info->dtype) {
    case DType::kF32:
      return ConvertAll<float, float>(raw, [](float v) { return v; });
    case DType::kF64:
      return ConvertAll<double, float>(raw, DoubleToFloat);
    case DType::kF16:
      return ConvertAll<uint16_t, float>(raw, HalfToFloat);
    case DType::kBF16:
      return ConvertAll<uint16_t, float>(raw, BFloat16ToFloat);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(source_name_, ": tensor '", info->name, "' is ",
                       DTypeName(info->dtype), ", not a floating type"));
  }
}

absl::StatusOr<std::vector<int64_t>> SafetensorsReader::ReadI64(
    absl::string_view name) const {
  ASSIGN_OR_RETURN(const TensorInfo* info, FindOrError(name));
  const std::span<const uint8_t> raw = RawBytes(*info);
  switch (info->dtype) {
    case DType::kI8:
      return WidenAll<int8_t>(raw);
    case DType::kI16:
      return WidenAll<int16_t>(raw);
    case DType::kI32:
      return WidenAll<int32_t>(raw);
    case DType::kI64:
      return WidenAll<int64_t>(raw);
    case DType::kU8:
      return WidenAll<uint8_t>(raw);
    case DType::kU16:
      return WidenAll<uint16_t>(raw);
    case DType::kU32:
      return WidenAll<uint32_t>(raw);
    case DType::kU64: {
      const size_t n = raw.size() / sizeof(uint64_t);
      std::vector<int64_t> out(n);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t v = Load<uint64_t>(raw, i);
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return absl::InvalidArgumentError(
              absl::StrCat(source_name_, ": tensor '", info->name,
                           "': U64 element ", i, " is ", v, ", beyond int64"));
        }
        out[i] = static_cast<int64_t>(v);
      }
      return out;
    }
    case DType::kBool: {
      std::vector<int64_t> out(raw.size());
      for (size_t i = 0; i < raw.size(); ++i) {
        // Anything but 0 or 1 is a corrupt byte, not a truth value.
        if (raw[i] > 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              source_name_, ": tensor '", info->name, "': BOOL element ", i,
              " is ", static_cast<int>(raw[i]), ", not 0 or 1"));
        }
        out[i] = raw[i];
      }
      return out;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(source_name_, ": tensor '", info->name, "' is ",
                       DTypeName(info->dtype), ", not an integer type"));
  }
}

}  // namespace conveyor::engine
