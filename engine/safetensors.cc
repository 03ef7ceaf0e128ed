#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "nlohmann/json.hpp"

namespace conveyor::engine {
namespace {

// The format stores little-endian data. Every machine we run on (x86-64,
// aarch64) is little-endian too, so tensor bytes are copied as they are
// rather than swapped element by element.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

// The reference implementation refuses headers above 100 MB; a larger one is
// a corrupt length rather than a real header, and refusing it early keeps a
// flipped length byte from costing a huge allocation.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr size_t kLengthPrefixBytes = 8;
constexpr std::string_view kMetadataKey = "__metadata__";

using Json = nlohmann::json;
// Keeps insertion order so the written header reads in layout order, with
// "__metadata__" first, as the reference writer produces it.
using OrderedJson = nlohmann::ordered_json;

template <typename... Args>
absl::Status Invalid(absl::string_view source, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", args...));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Element count of a shape with non-negative dimensions; false on int64
// overflow. A zero dimension makes the count 0 however large the others are.
bool CheckedNumel(const std::vector<int64_t>& shape, int64_t* numel) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    *numel = 0;
    return true;
  }
  int64_t n = 1;
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(n, dim, &n)) return false;
  }
  *numel = n;
  return true;
}

// Bytes a tensor of `dtype` and `shape` occupies; false on overflow.
bool CheckedByteSize(DType dtype, const std::vector<int64_t>& shape,
                     uint64_t* bytes) {
  int64_t numel = 0;
  if (!CheckedNumel(shape, &numel)) return false;
  return !__builtin_mul_overflow(static_cast<uint64_t>(numel),
                                 static_cast<uint64_t>(DTypeSize(dtype)),
                                 bytes);
}

// ---------------------------------------------------------------------------
// Reading

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

// ---------------------------------------------------------------------------
// Writing

struct Layout {
  // The padded JSON header, without the length prefix.
  std::string header;
  // Tensors in data buffer order.
  std::vector<const TensorToWrite*> order;
};

absl::StatusOr<Layout> PlanLayout(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const TensorToWrite& t : tensors) {
    const std::string where = absl::StrCat("tensor '", t.name, "'");
    if (t.name.empty()) {
      return absl::InvalidArgumentError("tensor name must not be empty");
    }
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name is reserved for metadata"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": name given twice"));
    }
    for (int64_t dim : t.shape) {
      if (dim < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": shape ", ShapeString(t.shape), " has a negative size"));
      }
    }
    uint64_t needed = 0;
    if (!CheckedByteSize(t.dtype, t.shape, &needed)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape ", ShapeString(t.shape),
                       " has more elements than fit in 64 bits"));
    }
    if (needed != t.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", t.bytes, " bytes given but ", DTypeName(t.dtype), " ",
          ShapeString(t.shape), " needs ", needed));
    }
    if (t.bytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": data is null"));
    }
  }

  Layout layout;
  for (const TensorToWrite& t : tensors) layout.order.push_back(&t);
  // Larger elements first: with the data buffer 8-byte aligned, every tensor
  // then starts at a multiple of its element size (the reference writer's
  // rule), so a mapped file can be read in place. Names break ties so the
  // bytes do not depend on the caller's order.
  std::sort(layout.order.begin(), layout.order.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) {
              const size_t sa = DTypeSize(a->dtype);
              const size_t sb = DTypeSize(b->dtype);
              if (sa != sb) return sa > sb;
              return a->name < b->name;
            });

  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson& meta = header[std::string(kMetadataKey)];
    meta = OrderedJson::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
  }
  uint64_t offset = 0;
  for (const TensorToWrite* t : layout.order) {
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = std::string(DTypeName(t->dtype));
    entry["shape"] = t->shape;
    // Cannot overflow: the buffers exist in memory.
    entry["data_offsets"] = OrderedJson::array({offset, offset + t->bytes});
    offset += t->bytes;
    header[t->name] = std::move(entry);
  }
  try {
    layout.header = header.dump();
  } catch (const OrderedJson::exception& e) {
    // dump() throws only on strings that are not UTF-8.
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor names and metadata must be valid UTF-8: ", e.what()));
  }
  // Spaces are JSON whitespace: padding to a multiple of 8 puts the data
  // buffer (after the 8-byte prefix) on an 8-byte boundary.
  layout.header.append((8 - layout.header.size() % 8) % 8, ' ');
  if (layout.header.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header would be ", layout.header.size(),
                     " bytes; readers refuse more than ", kMaxHeaderBytes));
  }
  return layout;
}

std::string LengthPrefix(uint64_t length) {
  std::string prefix(kLengthPrefixBytes, '\0');
  for (size_t i = 0; i < kLengthPrefixBytes; ++i) {
    prefix[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  }
  return prefix;
}

absl::Status WriteAll(int fd, const void* data, size_t size,
                      absl::string_view path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "write");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Makes the rename durable: it lives in the directory, not in the file.
absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, dir, "open directory");
  absl::Status status = absl::OkStatus();
  if (::fsync(fd) != 0) status = ErrnoError(errno, dir, "fsync directory");
  ::close(fd);
  return status;
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

// ---------------------------------------------------------------------------
// Writing

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(Layout layout, PlanLayout(tensors, metadata));
  size_t total = kLengthPrefixBytes + layout.header.size();
  for (const TensorToWrite* t : layout.order) total += t->bytes;
  std::string out;
  out.reserve(total);
  out += LengthPrefix(layout.header.size());
  out += layout.header;
  for (const TensorToWrite* t : layout.order) {
    if (t->bytes > 0) out.append(static_cast<const char*>(t->data), t->bytes);
  }
  return out;
}

absl::Status WriteSafetensors(
    const std::string& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(Layout layout, PlanLayout(tensors, metadata));
  // Written beside the destination (a rename cannot cross filesystems), so a
  // crash or error midway never leaves a partial file under `path`.
  const std::string temp = absl::StrCat(path, ".tmp-", ::getpid());
  const int fd =
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, temp, "open for writing");

  absl::Status status = [&]() -> absl::Status {
    const std::string prefix = LengthPrefix(layout.header.size());
    RETURN_IF_ERROR(WriteAll(fd, prefix.data(), prefix.size(), temp));
    RETURN_IF_ERROR(
        WriteAll(fd, layout.header.data(), layout.header.size(), temp));
    for (const TensorToWrite* t : layout.order) {
      RETURN_IF_ERROR(WriteAll(fd, t->data, t->bytes, temp));
    }
    // The data must be on disk before the rename publishes it; otherwise a
    // crash could leave the new name pointing at an empty file.
    if (::fsync(fd) != 0) return ErrnoError(errno, temp, "fsync");
    return absl::OkStatus();
  }();
  // close() can report a deferred write error (e.g. NFS), so it counts.
  if (::close(fd) != 0 && status.ok()) {
    status = ErrnoError(errno, temp, "close");
  }
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, path, absl::StrCat("rename from ", temp));
  }
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  return SyncDirectory(DirectoryOf(path));
}

}  // namespace conveyor::engine
