// What the safetensors reader (engine/safetensors_reader.cc) and writer
// (engine/safetensors_writer.cc) share about the file format: its size
// limits, the reserved metadata key, and the checked size arithmetic both
// use to validate shapes against byte counts.
//
// Not API: only engine/safetensors_*.cc include this. Pure functions and
// constants: thread-safe.
#ifndef CONVEYOR_ENGINE_INTERNAL_SAFETENSORS_FORMAT_H_
#define CONVEYOR_ENGINE_INTERNAL_SAFETENSORS_FORMAT_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/dtype.h"

namespace conveyor::engine::safetensors_internal {

// The format stores little-endian data. Every machine we run on (x86-64,
// aarch64) is little-endian too, so tensor bytes are copied as they are
// rather than swapped element by element.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

// The reference implementation refuses headers above 100 MB; a larger one is
// a corrupt length rather than a real header, and refusing it early keeps a
// flipped length byte from costing a huge allocation.
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
inline constexpr size_t kLengthPrefixBytes = 8;
inline constexpr std::string_view kMetadataKey = "__metadata__";

// "[2, 3]": a shape in error messages.
std::string ShapeString(const std::vector<int64_t>& shape);

// Element count of a shape with non-negative dimensions; false on int64
// overflow. A zero dimension makes the count 0 however large the others are.
bool CheckedNumel(const std::vector<int64_t>& shape, int64_t* numel);

// Bytes a tensor of `dtype` and `shape` occupies; false on overflow.
bool CheckedByteSize(DType dtype, const std::vector<int64_t>& shape,
                     uint64_t* bytes);

}  // namespace conveyor::engine::safetensors_internal

#endif  // CONVEYOR_ENGINE_INTERNAL_SAFETENSORS_FORMAT_H_
