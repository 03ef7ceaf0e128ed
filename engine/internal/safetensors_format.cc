// The safetensors format's checked size arithmetic
// (engine/internal/safetensors_format.h).
#include "engine/internal/safetensors_format.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace conveyor::engine::safetensors_internal {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

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

bool CheckedByteSize(DType dtype, const std::vector<int64_t>& shape,
                     uint64_t* bytes) {
  int64_t numel = 0;
  if (!CheckedNumel(shape, &numel)) return false;
  return !__builtin_mul_overflow(static_cast<uint64_t>(numel),
                                 static_cast<uint64_t>(DTypeSize(dtype)),
                                 bytes);
}

}  // namespace conveyor::engine::safetensors_internal
