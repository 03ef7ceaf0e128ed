#include "engine/tensor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/backend.h"

namespace conveyor::engine {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<uint64_t> ShapeBytes(const Shape& shape, DType dtype) {
  uint64_t elements = 1;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    }
    overflow |=
        __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements);
  }
  uint64_t bytes = 0;
  overflow |= __builtin_mul_overflow(
      elements, static_cast<uint64_t>(DTypeSize(dtype)), &bytes);
  if (overflow || elements > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeString(shape), " overflows"));
  }
  return bytes;
}

Buffer::~Buffer() {
  if (release_) {
    release_(data_, bytes_);
  } else {
    backend_->FreeBuffer(data_, bytes_);
  }
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, Shape shape, DType dtype,
               size_t offset_bytes)
    : buffer_(std::move(buffer)),
      shape_(std::move(shape)),
      dtype_(dtype),
      offset_bytes_(offset_bytes) {
  CONVEYOR_CHECK(offset_bytes_ + bytes() <= buffer_->bytes(),
                 "tensor view exceeds its buffer");
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += rank();
  CONVEYOR_CHECK(i >= 0 && i < rank(), "dimension index out of range");
  return shape_[i];
}

Tensor Tensor::Reshape(Shape shape) const {
  CONVEYOR_CHECK(NumElements(shape) == numel(),
                 "reshape must keep the element count");
  return Tensor(buffer_, std::move(shape), dtype_, offset_bytes_);
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  CONVEYOR_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
                 "row range out of bounds");
  Shape shape = shape_;
  shape[0] = end - begin;
  const size_t row_bytes =
      static_cast<size_t>(numel() / std::max<int64_t>(shape_[0], 1)) *
      DTypeSize(dtype_);
  return Tensor(buffer_, std::move(shape), dtype_,
                offset_bytes_ + static_cast<size_t>(begin) * row_bytes);
}

Tensor Tensor::As2D() const {
  CONVEYOR_CHECK(rank() >= 1, "As2D needs rank >= 1");
  const int64_t cols = shape_.back();
  return Reshape({cols == 0 ? 0 : numel() / cols, cols});
}

}  // namespace conveyor::engine
