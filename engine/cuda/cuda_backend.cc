// Host side of the CUDA backend: creation and teardown, the device and its
// compute stream (events, host waits, deferred errors), memory (the caching
// allocator, scratch, page-locked staging) and copies. The cuBLAS GEMMs are
// in cuda_backend_gemm.cc, the kernel fronts in cuda_backend_kernels.cc.
#include "engine/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_status.h"  // defines: CudaStatus, CONVEYOR_CUDA_CHECK
#include "engine/cuda/device_info.h"                 // defines: ListCudaDevices
#include "engine/cuda/internal/cuda_backend_impl.h"  // defines: Scratch, Ptr
#include "engine/cuda/internal/kernels.h"            // defines: DeviceScalars
#include "engine/device_peak.h"                      // defines: GpuPeakFlops

namespace conveyor::engine {

namespace ci = cuda_internal;

namespace {

// Hands a raw allocation to an owning pointer, or returns its error.
template <typename T>
absl::Status DeviceAlloc(CudaDevicePtr<T>& out, size_t bytes,
                         absl::string_view what) {
  void* raw = nullptr;
  if (const cudaError_t error = cudaMalloc(&raw, bytes); error != cudaSuccess) {
    return CudaStatus(error,
                      absl::StrCat("cudaMalloc(", bytes, " bytes) for ", what));
  }
  out.reset(static_cast<T*>(raw));
  return absl::OkStatus();
}

template <typename T>
absl::Status HostAlloc(CudaHostPtr<T>& out, absl::string_view what) {
  void* raw = nullptr;
  if (const cudaError_t error = cudaMallocHost(&raw, sizeof(T));
      error != cudaSuccess) {
    return CudaStatus(error, absl::StrCat("cudaMallocHost for ", what));
  }
  out.reset(static_cast<T*>(raw));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    int device, const CudaBackendOptions& options) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", device, ": device ordinals are >= 0"));
  }
  ASSIGN_OR_RETURN(std::vector<CudaDeviceInfo> devices, ListCudaDevices());
  if (devices.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, ": no CUDA device is visible (driver supports CUDA ",
        CudaDriverVersionString(), ", runtime is ", CudaRuntimeVersionString(),
        ")"));
  }
  if (device >= static_cast<int>(devices.size())) {
    return absl::NotFoundError(absl::StrCat(
        "cuda:", device, " does not exist: ", devices.size(),
        " CUDA device(s) visible (cuda:0 to cuda:", devices.size() - 1, ")"));
  }
  const std::string where = absl::StrCat("cuda:", device);
  // Runs a kernel of this binary on the device: a build for another GPU
  // architecture fails here with kFailedPrecondition instead of aborting at
  // the first kernel launch of a training step. Leaves `device` current.
  RETURN_IF_ERROR(RunDeviceSmokeTest(device));
  std::unique_ptr<CudaBackend> b(new CudaBackend(device, options));
  const CudaDeviceInfo& info = devices[device];
  b->memory_capacity_ = info.total_memory_bytes;
  b->peak_flops_ =
      GpuPeakFlops({.compute_major = info.compute_major,
                    .compute_minor = info.compute_minor,
                    .multiprocessors = info.multiprocessors,
                    .clock_khz = static_cast<double>(info.clock_khz)},
                   options.precision);

  cudaStream_t stream = nullptr;
  // Non-blocking: the legacy default stream, which other libraries may use,
  // must not serialize against our compute.
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                 absl::StrCat(where, ": cudaStreamCreateWithFlags")));
  b->stream_.reset(stream);
  cudaEvent_t event = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                 absl::StrCat(where, ": cudaEventCreateWithFlags")));
  b->host_wait_event_.reset(event);

  cublasHandle_t handle = nullptr;
  RETURN_IF_ERROR(CublasStatus(cublasCreate(&handle),
                               absl::StrCat(where, ": cublasCreate")));
  b->cublas_.reset(handle);
  RETURN_IF_ERROR(CublasStatus(cublasSetStream(handle, stream),
                               absl::StrCat(where, ": cublasSetStream")));
  // After cublasSetStream, which resets the workspace to cuBLAS's own pool.
  if (options.cublas_workspace_bytes > 0) {
    RETURN_IF_ERROR(DeviceAlloc(b->cublas_workspace_,
                                options.cublas_workspace_bytes,
                                absl::StrCat(where, " cuBLAS workspace")));
    RETURN_IF_ERROR(
        CublasStatus(cublasSetWorkspace(handle, b->cublas_workspace_.get(),
                                        options.cublas_workspace_bytes),
                     absl::StrCat(where, ": cublasSetWorkspace")));
  }
  // Default math: with CUBLAS_COMPUTE_32F (per call) no TF32 tensor cores,
  // whatever a caller may have set on the handle before.
  RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH),
                               absl::StrCat(where, ": cublasSetMathMode")));

  RETURN_IF_ERROR(DeviceAlloc(b->scalars_, sizeof(ci::DeviceScalars),
                              absl::StrCat(where, " reduction results")));
  RETURN_IF_ERROR(DeviceAlloc(b->partials_,
                              sizeof(double) * ci::kMaxReduceBlocks,
                              absl::StrCat(where, " partial sums")));
  RETURN_IF_ERROR(HostAlloc(b->host_scalars_, "reduction results"));
  RETURN_IF_ERROR(HostAlloc(b->host_id_, "id lookups"));

  b->allocator_ =
      std::make_unique<CachingAllocator>(CachingAllocator::RawAllocator{
          .allocate = [device](size_t bytes) -> absl::StatusOr<void*> {
            RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
            void* ptr = nullptr;
            if (const cudaError_t error = cudaMalloc(&ptr, bytes);
                error != cudaSuccess) {
              return CudaStatus(
                  error, absl::StrCat("cuda:", device, ": cudaMalloc(", bytes,
                                      " bytes)"));
            }
            return ptr;
          },
          .release = [](void* ptr, size_t /*bytes*/) { (void)cudaFree(ptr); },
      });
  b->host_staging_ = std::make_unique<HostStagingPool>(
      [device](size_t bytes) -> absl::StatusOr<void*> {
        // The TCP channel's I/O thread allocates too: make the device
        // current there. Portable, so every context may DMA from it.
        RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
        void* ptr = nullptr;
        if (const cudaError_t error =
                cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
            error != cudaSuccess) {
          return CudaStatus(
              error, absl::StrCat("cuda:", device, ": cudaHostAlloc(", bytes,
                                  " bytes)"));
        }
        return ptr;
      },
      // The last holder may be any thread (the TCP I/O thread after a
      // send): without the device current there, the runtime would make a
      // context on device 0, which may be another worker's GPU.
      [device](void* ptr) {
        (void)cudaSetDevice(device);
        (void)cudaFreeHost(ptr);
      },
      options.host_staging_bytes);
  return b;
}

absl::StatusOr<Tensor> CudaBackend::EmptyHostStaging(const Shape& shape,
                                                     DType dtype) {
  return host_staging_->Empty(CpuBackend::Get(), shape, dtype);
}

CudaBackend::CudaBackend(int device, const CudaBackendOptions& options)
    : device_(device),
      options_(options),
      name_(absl::StrCat("cuda:", device)) {}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) {
    Activate();
    // Nothing may still be running on memory the members below free.
    (void)cudaStreamSynchronize(stream_.get());
  }
  // The allocator goes first (cudaFree), while the device is still current.
  allocator_.reset();
}

void CudaBackend::Activate() const {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device_) {
    CONVEYOR_CUDA_CHECK(cudaSetDevice(device_));
  }
}

CudaBackend::Scratch CudaBackend::ScratchOrDefer(size_t bytes,
                                                 absl::string_view what) {
  absl::StatusOr<void*> ptr = allocator_->Allocate(bytes);
  if (!ptr.ok()) {
    if (deferred_error_.ok()) {
      deferred_error_ =
          absl::Status(ptr.status().code(),
                       absl::StrCat(name_, ": ", what,
                                    " skipped: ", ptr.status().message()));
    }
    return Scratch();
  }
  return Scratch(allocator_.get(), *ptr);
}

absl::Status CudaBackend::WaitForHost(absl::string_view what) {
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(host_wait_event_.get(), stream()),
                             absl::StrCat(name_, ": ", what, ": record")));
  RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(host_wait_event_.get()),
                             absl::StrCat(name_, ": ", what)));
  return std::exchange(deferred_error_, absl::OkStatus());
}

absl::Status CudaBackend::FetchScalars(absl::string_view what) {
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(host_scalars_.get(), scalars_.get(),
                                 sizeof(ci::DeviceScalars),
                                 cudaMemcpyDeviceToHost, stream()),
                 absl::StrCat(name_, ": ", what, ": copy result")));
  return WaitForHost(what);
}

absl::StatusOr<int64_t> CudaBackend::FetchId(const Tensor& ids, int64_t index) {
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(host_id_.get(), Ptr<int64_t>(ids) + index,
                      sizeof(int64_t), cudaMemcpyDeviceToHost, stream()),
      absl::StrCat(name_, ": copy an id")));
  RETURN_IF_ERROR(WaitForHost("copy an id"));
  return *host_id_;
}

absl::Status CudaBackend::RecordEvent(void* event) {
  Activate();
  return CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(event), stream()),
                    absl::StrCat(name_, ": cudaEventRecord"));
}

absl::Status CudaBackend::WaitForEvent(void* event) {
  Activate();
  return CudaStatus(
      cudaStreamWaitEvent(stream(), static_cast<cudaEvent_t>(event), 0),
      absl::StrCat(name_, ": cudaStreamWaitEvent"));
}

absl::Status CudaBackend::EmptyCache() {
  RETURN_IF_ERROR(Synchronize());
  allocator_->EmptyCache();
  return absl::OkStatus();
}

// --- Memory ------------------------------------------------------------------

absl::StatusOr<Tensor> CudaBackend::Empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", ShapeString(shape)));
    }
  }
  // Sizes come from model specs and data files: overflow is an input error.
  uint64_t elements = 1, bytes = 0;
  bool overflow = false;
  for (int64_t d : shape) {
    overflow |=
        __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements);
  }
  overflow |= __builtin_mul_overflow(elements, DTypeSize(dtype), &bytes);
  if (overflow || elements > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": tensor ", DTypeName(dtype), ShapeString(shape),
                     " is too large to address"));
  }
  Activate();
  absl::StatusOr<void*> ptr = allocator_->Allocate(bytes);
  if (!ptr.ok()) {
    return absl::Status(
        ptr.status().code(),
        absl::StrCat(name_, ": tensor ", DTypeName(dtype), ShapeString(shape),
                     ": ", ptr.status().message()));
  }
  return Tensor(
      std::make_shared<Buffer>(this, *ptr, CachingAllocator::RoundSize(bytes)),
      shape, dtype);
}

void CudaBackend::FreeBuffer(void* data, size_t /*bytes*/) {
  allocator_->Free(data);
}

absl::Status CudaBackend::CopyFromHost(const void* src, size_t bytes,
                                       const Tensor& dst) {
  if (bytes != dst.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy of ", bytes, " bytes into a tensor of ", dst.bytes()));
  }
  if (bytes == 0) return absl::OkStatus();
  CONVEYOR_CHECK(dst.backend() == this,
                 "a tensor of another backend was passed to the CUDA backend");
  Activate();
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(dst.raw(), src, bytes, cudaMemcpyHostToDevice, stream()),
      absl::StrCat(name_, ": copy of ", bytes, " bytes from the host")));
  // From pageable memory the call returns once the driver has staged the
  // source, so the caller may reuse it at once. From page-locked memory the
  // DMA reads the source later: wait for it, as the contract promises.
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, src) != cudaSuccess) {
    (void)cudaGetLastError();
    return WaitForHost("copy from the host");
  }
  if (attributes.type != cudaMemoryTypeUnregistered) {
    return WaitForHost("copy from the host");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(const Tensor& src, void* dst,
                                     size_t bytes) {
  if (bytes != src.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy of a tensor of ", src.bytes(), " bytes into ", bytes));
  }
  if (bytes == 0) return absl::OkStatus();
  CONVEYOR_CHECK(src.backend() == this,
                 "a tensor of another backend was passed to the CUDA backend");
  Activate();
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(dst, src.raw(), bytes, cudaMemcpyDeviceToHost, stream()),
      absl::StrCat(name_, ": copy of ", bytes, " bytes to the host")));
  return WaitForHost("copy to the host");
}

void CudaBackend::DoCopy(const Tensor& src, const Tensor& dst) {
  CONVEYOR_CHECK(src.backend() == this && dst.backend() == this,
                 "a tensor of another backend was passed to the CUDA backend");
  if (src.bytes() == 0 || src.raw() == dst.raw()) return;
  Activate();
  CONVEYOR_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(),
                                      cudaMemcpyDeviceToDevice, stream()));
}

MemoryStats CudaBackend::memory_stats() const {
  const CachingAllocator::Stats s = allocator_->stats();
  return {.allocated = s.bytes_in_use,
          .peak_allocated = s.peak_bytes_in_use,
          .reserved = s.bytes_in_use + s.bytes_cached,
          .peak_reserved = s.peak_bytes_reserved,
          .capacity = memory_capacity_};
}

void CudaBackend::ResetPeakMemory() { allocator_->ResetPeaks(); }

absl::Status CudaBackend::Synchronize() {
  Activate();
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream()),
                             absl::StrCat(name_, ": cudaStreamSynchronize")));
  return std::exchange(deferred_error_, absl::OkStatus());
}

}  // namespace conveyor::engine
