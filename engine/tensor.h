// Tensor: a shaped, typed view of memory owned by a backend.
//
// A Tensor is a cheap handle: copies share the buffer (like torch.Tensor), and
// the buffer is returned to its backend when the last handle goes. Views
// (Reshape, Rows) share the buffer too. Data pointers are device pointers:
// only a CPU tensor's may be dereferenced on the host, and only after the
// backend's work on it is done (Backend::Synchronize). Contiguous row-major
// layout always; there are no strides, which keeps every kernel simple.
// Thread-compatible: concurrent reads are fine, writes need outside locking.
#ifndef CONVEYOR_ENGINE_TENSOR_H_
#define CONVEYOR_ENGINE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/check.h"
#include "engine/dtype.h"

namespace conveyor::engine {

class Backend;

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar shape []).
int64_t NumElements(const Shape& shape);

// "[2, 3]".
std::string ShapeString(const Shape& shape);

// The bytes a tensor of `shape` and `dtype` holds, for sizes that come from
// outside (the wire, files): InvalidArgument "negative dimension N" or
// "shape [..] overflows" (its element count or byte size beyond 64 bits or
// its element count beyond int64), never a wrapped size.
absl::StatusOr<uint64_t> ShapeBytes(const Shape& shape, DType dtype);

// Memory a backend computes on; returned to it on destruction.
class Buffer {
 public:
  // Memory `backend` allocated: its FreeBuffer takes it back.
  Buffer(Backend* backend, void* data, size_t bytes)
      : backend_(backend), data_(data), bytes_(bytes) {}
  // Memory lent to `backend` by someone else, who takes it back through
  // `release` (page-locked host memory a device backend stages its tensors
  // through: engine/host_staging_pool.h).
  Buffer(Backend* backend, void* data, size_t bytes,
         std::function<void(void*, size_t)> release)
      : backend_(backend),
        data_(data),
        bytes_(bytes),
        release_(std::move(release)) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Backend* backend() const { return backend_; }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_;
  void* data_;
  size_t bytes_;
  std::function<void(void*, size_t)> release_;  // Empty: backend_.
};

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buffer, Shape shape, DType dtype,
         size_t offset_bytes = 0);

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  DType dtype() const { return dtype_; }
  int64_t numel() const { return NumElements(shape_); }
  size_t bytes() const {
    return static_cast<size_t>(numel()) * DTypeSize(dtype_);
  }
  Backend* backend() const { return buffer_ ? buffer_->backend() : nullptr; }

  // The first element, typed. Aborts if T does not match dtype(): a mismatch
  // is a bug in the caller, not bad input.
  template <typename T>
  T* data() const {
    CONVEYOR_CHECK(dtype_ == DTypeOf<T>(), "tensor element type mismatch");
    return reinterpret_cast<T*>(raw());
  }
  void* raw() const {
    CONVEYOR_CHECK(defined(), "data of an undefined tensor");
    return static_cast<char*>(buffer_->data()) + offset_bytes_;
  }

  // Same data, another shape with the same element count.
  Tensor Reshape(Shape shape) const;
  // Rows [begin, end) along dimension 0, sharing the buffer.
  Tensor Rows(int64_t begin, int64_t end) const;
  // Leading dimensions collapsed: [rows, last dim].
  Tensor As2D() const;

 private:
  std::shared_ptr<Buffer> buffer_;
  Shape shape_;
  DType dtype_ = DType::kF32;
  size_t offset_bytes_ = 0;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_TENSOR_H_
