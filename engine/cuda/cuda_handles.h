// Owning handles for CUDA runtime objects: std::unique_ptr with a deleter, so
// a stream, event, device allocation or page-locked host allocation is
// released on every return path.
//
//   cudaStream_t raw = nullptr;
//   RETURN_IF_ERROR(CudaStatus(cudaStreamCreate(&raw), "cudaStreamCreate"));
//   CudaStreamPtr stream(raw);
//
// The deleters ignore the result of the destroy/free call: a destructor
// cannot return a Status, and the only failures left at that point are a
// context already broken by an earlier (reported) error or process teardown.
//
// Thread-safety: like std::unique_ptr; destroying a handle may block until
// work queued on it finishes (cudaFree synchronizes the device).
#ifndef CONVEYOR_ENGINE_CUDA_CUDA_HANDLES_H_
#define CONVEYOR_ENGINE_CUDA_CUDA_HANDLES_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <type_traits>

namespace conveyor {

struct CudaStreamDeleter {
  void operator()(cudaStream_t stream) const noexcept {
    (void)cudaStreamDestroy(stream);
  }
};
using CudaStreamPtr =
    std::unique_ptr<std::remove_pointer_t<cudaStream_t>, CudaStreamDeleter>;

struct CudaEventDeleter {
  void operator()(cudaEvent_t event) const noexcept {
    (void)cudaEventDestroy(event);
  }
};
using CudaEventPtr =
    std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, CudaEventDeleter>;

// Memory from cudaMalloc. Holds a device pointer: never dereference it on the
// host.
struct CudaFreeDeleter {
  void operator()(void* device_ptr) const noexcept {
    (void)cudaFree(device_ptr);
  }
};
template <typename T>
using CudaDevicePtr = std::unique_ptr<T, CudaFreeDeleter>;

// Page-locked host memory from cudaMallocHost: the target of device-to-host
// copies that must not stage through a bounce buffer.
struct CudaFreeHostDeleter {
  void operator()(void* host_ptr) const noexcept {
    (void)cudaFreeHost(host_ptr);
  }
};
template <typename T>
using CudaHostPtr = std::unique_ptr<T, CudaFreeHostDeleter>;

}  // namespace conveyor

#endif  // CONVEYOR_ENGINE_CUDA_CUDA_HANDLES_H_
