// The CudaBackend's private pieces that its .cc files share
// (engine/cuda/cuda_backend.cc: creation, memory and the stream;
// cuda_backend_gemm.cc: cuBLAS GEMMs; cuda_backend_kernels.cc: the kernel
// fronts): the Scratch block and the checked device pointer of a tensor.
//
// Not API: only engine/cuda/cuda_backend*.cc include this. Thread-safety:
// as CudaBackend's.
#ifndef CONVEYOR_ENGINE_CUDA_INTERNAL_CUDA_BACKEND_IMPL_H_
#define CONVEYOR_ENGINE_CUDA_INTERNAL_CUDA_BACKEND_IMPL_H_

#include <utility>

#include "common/check.h"
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/tensor.h"

namespace conveyor::engine {

class CudaBackend::Scratch {
 public:
  Scratch() = default;
  Scratch(CachingAllocator* allocator, void* ptr)
      : allocator_(allocator), ptr_(ptr) {}
  Scratch(Scratch&& other) noexcept
      : allocator_(other.allocator_),
        ptr_(std::exchange(other.ptr_, nullptr)) {}
  Scratch& operator=(Scratch&&) = delete;
  ~Scratch() {
    if (ptr_ != nullptr) allocator_->Free(ptr_);
  }

  bool ok() const { return ptr_ != nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  CachingAllocator* allocator_ = nullptr;
  void* ptr_ = nullptr;
};

template <typename T>
T* CudaBackend::Ptr(const Tensor& t) const {
  CONVEYOR_CHECK(t.backend() == this,
                 "a tensor of another backend was passed to the CUDA backend");
  return t.data<T>();
}

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_CUDA_INTERNAL_CUDA_BACKEND_IMPL_H_
