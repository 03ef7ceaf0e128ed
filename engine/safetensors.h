// Reading and writing safetensors files, the format model parameters are
// exchanged in (https://github.com/huggingface/safetensors):
//
//   8 bytes   N, the header size, unsigned little-endian
//   N bytes   UTF-8 JSON object: tensor name -> {"dtype": "F32",
//             "shape": [2, 3], "data_offsets": [begin, end]}, plus an
//             optional "__metadata__": {string: string}
//   rest      the data buffer; offsets are relative to its start; tensors
//             are little-endian, row-major, and cover it with no hole or
//             overlap
//
// The reader treats the file as untrusted input: every inconsistency (a
// truncated file, offsets out of range or overlapping, a shape whose size
// disagrees with its offsets, duplicate names, ...) is an InvalidArgument
// naming the file and the tensor, never a crash or an out-of-bounds read.
// It holds the whole file in memory: our files are at most a few hundred MB.
//
// The writer lays tensors out as the reference implementation does (larger
// dtypes first, then by name, so that each tensor is aligned to its element
// size once the data buffer is 8-byte aligned, which the header padding
// ensures), and replaces the destination atomically.
//
// Thread-safety: a SafetensorsReader is immutable once built, so its const
// methods may be called from any number of threads. The free functions are
// thread-safe, except that two concurrent WriteSafetensors calls from the same
// process to the same path share one temporary file name.
#ifndef CONVEYOR_ENGINE_SAFETENSORS_H_
#define CONVEYOR_ENGINE_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/dtype.h"

namespace conveyor::engine {

// One tensor's entry in a safetensors header.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  // Row-major; empty for a 0-d scalar (one element).
  std::vector<int64_t> shape;
  // Byte range [begin, end) in the data buffer (after the header).
  uint64_t begin = 0;
  uint64_t end = 0;

  // Product of `shape` (1 for a scalar). The reader guarantees it fits.
  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

class SafetensorsReader {
 public:
  // Reads and validates the whole file. Returns the errno-derived code
  // (NotFound, PermissionDenied, ...) if it cannot be read, InvalidArgument
  // if it is not a consistent safetensors file.
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);

  // Validates `bytes` as a safetensors file. `source_name` prefixes error
  // messages in place of a path. Returns InvalidArgument if inconsistent,
  // ResourceExhausted if memory runs out while parsing the header.
  static absl::StatusOr<SafetensorsReader> FromBytes(
      std::string bytes, std::string source_name = "<memory>");

  SafetensorsReader(SafetensorsReader&&) = default;
  SafetensorsReader& operator=(SafetensorsReader&&) = default;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  // The path or source name given at construction.
  const std::string& source_name() const { return source_name_; }

  // All tensors in file order: by begin offset; empty tensors that share an
  // offset come first, by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  // nullptr if there is no tensor called `name`.
  const TensorInfo* Find(absl::string_view name) const;

  // "__metadata__", empty if the file has none.
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

  // The tensor's raw little-endian bytes, valid while this reader lives.
  // Not aligned in general: copy with memcpy, do not cast the pointer.
  // NotFound if there is no such tensor.
  absl::StatusOr<std::span<const uint8_t>> RawBytes(
      absl::string_view name) const;
  // `info` must be an element of tensors().
  std::span<const uint8_t> RawBytes(const TensorInfo& info) const;

  // The tensor converted to float: F32 as is, F64/F16/BF16 by IEEE
  // conversion (round to nearest even; NaN stays NaN). NotFound if there is
  // no such tensor, InvalidArgument if its dtype is not a floating type.
  absl::StatusOr<std::vector<float>> ReadF32(absl::string_view name) const;

  // The tensor converted to int64: I8..I64, U8..U64 and BOOL (0 or 1).
  // NotFound if there is no such tensor; InvalidArgument if its dtype is a
  // floating type, a U64 value exceeds INT64_MAX or a BOOL byte is not 0/1.
  absl::StatusOr<std::vector<int64_t>> ReadI64(absl::string_view name) const;

 private:
  SafetensorsReader() = default;

  absl::StatusOr<const TensorInfo*> FindOrError(absl::string_view name) const;

  std::string source_name_;
  std::string bytes_;        // The whole file.
  uint64_t data_start_ = 0;  // Offset of the data buffer in bytes_.
  std::vector<TensorInfo> tensors_;
  // Name -> index into tensors_; std::less<> allows lookup by string_view.
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// One tensor for the writer. `data` points to `bytes` bytes in the host's
// (little-endian) byte order, row-major; it may be null when `bytes` is 0.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// The complete file contents. Tensors are laid out by decreasing element
// size, then by name, whatever the order of `tensors`; the header is padded
// with spaces to a multiple of 8 bytes. Returns InvalidArgument if a name is
// empty, repeated, "__metadata__" or not UTF-8, a dimension is negative,
// `bytes` disagrees with the shape, or a metadata string is not UTF-8.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// Writes what SerializeSafetensors would return to `path`, atomically: into
// "<path>.tmp-<pid>", fsync, rename over `path`, fsync the directory. On
// failure no file is left at either name (an existing `path` is untouched
// unless the rename succeeded). Returns the errors of SerializeSafetensors,
// or the errno-derived code with the path and the failed call.
absl::Status WriteSafetensors(
    const std::string& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_SAFETENSORS_H_
