// Host side of the CUDA backend: creation, memory, copies, cuBLAS GEMMs, and
// the argument checks and scratch memory around the kernel launchers of
// cuda_kernels.cu and cuda_nn_kernels.cu.
#include "engine/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_status.h"  // defines: CudaStatus, CONVEYOR_CUDA_CHECK
#include "engine/cuda/device_info.h"       // defines: ListCudaDevices
#include "engine/cuda/internal/kernels.h"  // defines: the kernel launchers
#include "engine/device_peak.h"            // defines: GpuPeakFlops

namespace conveyor::engine {

namespace ci = cuda_internal;

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

int AsInt(int64_t v, const char* what) {
  CONVEYOR_CHECK(v >= 0 && v <= INT_MAX, what);
  return static_cast<int>(v);
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

template <typename T>
T* CudaBackend::Ptr(const Tensor& t) const {
  CONVEYOR_CHECK(t.backend() == this,
                 "a tensor of another backend was passed to the CUDA backend");
  return t.data<T>();
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

absl::Status CudaBackend::Synchronize() {
  Activate();
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream()),
                             absl::StrCat(name_, ": cudaStreamSynchronize")));
  return std::exchange(deferred_error_, absl::OkStatus());
}

// --- Linear algebra ----------------------------------------------------------

void CudaBackend::GemmStridedBatched(const GemmBatch& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  Activate();
  if (g.k == 0) {
    // BLAS semantics (C = beta C, and beta == 0 ignores C); cuBLAS may
    // return early without touching C.
    ci::ScaleMatrices(g.batch, g.m, g.n, g.beta, g.c, g.ldc, g.stride_c,
                      stream());
    return;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // same memory, with the operands swapped and m and n exchanged.
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = AsInt(g.m, "gemm m exceeds int"),
            n = AsInt(g.n, "gemm n exceeds int"),
            k = AsInt(g.k, "gemm k exceeds int");
  const int lda = AsInt(g.lda, "gemm lda exceeds int"),
            ldb = AsInt(g.ldb, "gemm ldb exceeds int"),
            ldc = AsInt(g.ldc, "gemm ldc exceeds int");
  const cublasComputeType_t compute =
      options_.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (options_.precision == Precision::kBf16) {
    GemmBf16(g, op_a, op_b, m, n, k, lda, ldb, ldc);
    return;
  }
  if (g.batch == 1) {
    CONVEYOR_CUBLAS_CHECK(
        cublasGemmEx(cublas_.get(), op_b, op_a, n, m, k, &g.alpha, g.b,
                     CUDA_R_32F, ldb, g.a, CUDA_R_32F, lda, &g.beta, g.c,
                     CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  CONVEYOR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_.get(), op_b, op_a, n, m, k, &g.alpha, g.b, CUDA_R_32F, ldb,
      g.stride_b, g.a, CUDA_R_32F, lda, g.stride_a, &g.beta, g.c, CUDA_R_32F,
      ldc, g.stride_c, AsInt(g.batch, "gemm batch exceeds int"), compute,
      CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::GemmBf16(const GemmBatch& g, cublasOperation_t op_a,
                           cublasOperation_t op_b, int m, int n, int k, int lda,
                           int ldb, int ldc) {
  // Rounded copies of the spans the operands cover, in scratch memory from
  // the caching allocator (no cudaMalloc here); freed once the GEMM is
  // queued, which is safe because every kernel runs on the one stream.
  const int64_t extent_a = GemmExtentA(g);
  const int64_t extent_b = GemmExtentB(g);
  Scratch a16 = ScratchOrDefer(extent_a * sizeof(uint16_t), "bf16 GEMM");
  Scratch b16 = ScratchOrDefer(extent_b * sizeof(uint16_t), "bf16 GEMM");
  if (!a16.ok() || !b16.ok()) return;
  ci::ToBf16(g.a, a16.as<uint16_t>(), extent_a, stream());
  ci::ToBf16(g.b, b16.as<uint16_t>(), extent_b, stream());
  if (g.batch == 1) {
    CONVEYOR_CUBLAS_CHECK(cublasGemmEx(
        cublas_.get(), op_b, op_a, n, m, k, &g.alpha, b16.as<uint16_t>(),
        CUDA_R_16BF, ldb, a16.as<uint16_t>(), CUDA_R_16BF, lda, &g.beta, g.c,
        CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  CONVEYOR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_.get(), op_b, op_a, n, m, k, &g.alpha, b16.as<uint16_t>(),
      CUDA_R_16BF, ldb, g.stride_b, a16.as<uint16_t>(), CUDA_R_16BF, lda,
      g.stride_a, &g.beta, g.c, CUDA_R_32F, ldc, g.stride_c,
      AsInt(g.batch, "gemm batch exceeds int"), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

// --- Elementwise -------------------------------------------------------------

void CudaBackend::Fill(const Tensor& x, float value) {
  Activate();
  ci::Fill(F(x), x.numel(), value, stream());
}

void CudaBackend::Scale(const Tensor& x, float alpha) {
  Activate();
  ci::Scale(F(x), x.numel(), alpha, stream());
}

void CudaBackend::DoAxpy(float alpha, const Tensor& x, const Tensor& y) {
  Activate();
  ci::Axpy(alpha, F(x), F(y), x.numel(), stream());
}

void CudaBackend::DoAdd(const Tensor& a, const Tensor& b, const Tensor& out) {
  Activate();
  ci::Add(F(a), F(b), F(out), a.numel(), stream());
}

void CudaBackend::DoAddRowBias(const Tensor& x, const Tensor& bias) {
  const int64_t cols = bias.numel();
  Activate();
  ci::AddRowBias(F(x), F(bias), x.numel() / cols, cols, stream());
}

void CudaBackend::DoSumRows(const Tensor& x, float beta, const Tensor& out) {
  const int64_t cols = out.numel();
  const int64_t rows = x.numel() / cols;
  Activate();
  const int64_t floats = ci::ColumnSumScratchFloats(rows, cols, 1);
  Scratch scratch = floats > 0
                        ? ScratchOrDefer(floats * sizeof(float), "SumRows")
                        : Scratch();
  if (floats > 0 && !scratch.ok()) return;
  ci::SumRows(F(x), rows, cols, beta, F(out), scratch.as<float>(), stream());
}

void CudaBackend::DoRelu(const Tensor& x, const Tensor& y) {
  Activate();
  ci::Relu(F(x), F(y), x.numel(), stream());
}

void CudaBackend::DoReluBackward(const Tensor& x, const Tensor& dy,
                                 const Tensor& dx) {
  Activate();
  ci::ReluBackward(F(x), F(dy), F(dx), x.numel(), stream());
}

void CudaBackend::DoGelu(const Tensor& x, bool tanh, const Tensor& y) {
  Activate();
  ci::Gelu(F(x), tanh, F(y), x.numel(), stream());
}

void CudaBackend::DoGeluBackward(const Tensor& x, bool tanh, const Tensor& dy,
                                 const Tensor& dx) {
  Activate();
  ci::GeluBackward(F(x), tanh, F(dy), F(dx), x.numel(), stream());
}

// --- Layer normalization -----------------------------------------------------

void CudaBackend::DoLayerNorm(const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, float eps, const Tensor& y,
                              const Tensor& mean, const Tensor& rstd) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::LayerNorm(F(x), gamma.defined() ? F(gamma) : nullptr,
                beta.defined() ? F(beta) : nullptr, eps, rows, cols, F(y),
                F(mean), F(rstd), stream());
}

void CudaBackend::DoLayerNormBackwardInput(const Tensor& x, const Tensor& gamma,
                                           const Tensor& mean,
                                           const Tensor& rstd, const Tensor& dy,
                                           const Tensor& dx) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::LayerNormBackwardInput(F(x), gamma.defined() ? F(gamma) : nullptr,
                             F(mean), F(rstd), F(dy), rows, cols, F(dx),
                             stream());
}

void CudaBackend::DoLayerNormBackwardWeight(const Tensor& x, const Tensor& mean,
                                            const Tensor& rstd,
                                            const Tensor& dy,
                                            const Tensor& dgamma,
                                            const Tensor& dbeta) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  const int64_t floats = ci::ColumnSumScratchFloats(rows, cols, 2);
  Scratch scratch = floats > 0 ? ScratchOrDefer(floats * sizeof(float),
                                                "LayerNormBackwardWeight")
                               : Scratch();
  if (floats > 0 && !scratch.ok()) return;
  ci::LayerNormBackwardWeight(F(x), F(mean), F(rstd), F(dy), rows, cols,
                              F(dgamma), F(dbeta), scratch.as<float>(),
                              stream());
}

// --- Llama-family pieces -----------------------------------------------------

void CudaBackend::DoRmsNorm(const Tensor& x, const Tensor& weight, float eps,
                            const Tensor& y, const Tensor& rstd) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::RmsNorm(F(x), F(weight), eps, rows, cols, F(y), F(rstd), stream());
}

void CudaBackend::DoRmsNormBackwardInput(const Tensor& x, const Tensor& weight,
                                         const Tensor& rstd, const Tensor& dy,
                                         const Tensor& dx) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::RmsNormBackwardInput(F(x), F(weight), F(rstd), F(dy), rows, cols, F(dx),
                           stream());
}

void CudaBackend::DoRmsNormBackwardWeight(const Tensor& x, const Tensor& rstd,
                                          const Tensor& dy,
                                          const Tensor& dweight) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  const int64_t floats = ci::ColumnSumScratchFloats(rows, cols, 1);
  Scratch scratch = floats > 0 ? ScratchOrDefer(floats * sizeof(float),
                                                "RmsNormBackwardWeight")
                               : Scratch();
  if (floats > 0 && !scratch.ok()) return;
  ci::RmsNormBackwardWeight(F(x), F(rstd), F(dy), rows, cols, F(dweight),
                            scratch.as<float>(), stream());
}

void CudaBackend::DoSiluMul(const Tensor& gate, const Tensor& up,
                            const Tensor& y) {
  Activate();
  ci::SiluMul(F(gate), F(up), F(y), gate.numel(), stream());
}

void CudaBackend::DoSiluMulBackward(const Tensor& gate, const Tensor& up,
                                    const Tensor& dy, const Tensor& dgate,
                                    const Tensor& dup) {
  Activate();
  ci::SiluMulBackward(F(gate), F(up), F(dy), F(dgate), F(dup), gate.numel(),
                      stream());
}

void CudaBackend::DoRope(const Tensor& x, float theta, bool inverse,
                         const Tensor& y, int64_t first_position) {
  const int64_t dim = x.dim(-1), seq = x.dim(-2);
  const int64_t rows = x.numel() / std::max<int64_t>(dim * seq, 1);
  Activate();
  ci::Rope(F(x), rows, seq, dim, first_position, theta, inverse, F(y),
           stream());
}

// --- Attention pieces --------------------------------------------------------

void CudaBackend::DoSoftmax(const Tensor& x, float scale, bool causal,
                            const Tensor& y) {
  const int64_t cols = x.dim(-1);
  const int64_t rows_per = x.rank() >= 2 ? x.dim(-2) : 1;
  const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::Softmax(F(x), scale, causal, rows, std::max<int64_t>(rows_per, 1), cols,
              F(y), stream());
}

void CudaBackend::DoSoftmaxBackward(const Tensor& y, const Tensor& dy,
                                    float scale, const Tensor& dx) {
  const int64_t cols = y.dim(-1), rows = y.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::SoftmaxBackward(F(y), F(dy), scale, rows, cols, F(dx), stream());
}

void CudaBackend::DoSplitHeads(const Tensor& qkv, int64_t heads,
                               const Tensor& q, const Tensor& k,
                               const Tensor& v) {
  Activate();
  ci::PermuteQkv(F(qkv), q.dim(0), q.dim(2), heads, q.dim(3), F(q), F(k), F(v),
                 /*to_heads=*/true, stream());
}

void CudaBackend::DoSplitHeadsBackward(const Tensor& dq, const Tensor& dk,
                                       const Tensor& dv, int64_t heads,
                                       const Tensor& dqkv) {
  Activate();
  ci::PermuteQkv(F(dqkv), dq.dim(0), dq.dim(2), heads, dq.dim(3), F(dq), F(dk),
                 F(dv), /*to_heads=*/false, stream());
}

void CudaBackend::DoMergeHeads(const Tensor& x, const Tensor& out) {
  Activate();
  ci::PermuteMerge(F(x), x.dim(0), x.dim(1), x.dim(2), x.dim(3), F(out),
                   /*to_merged=*/true, stream());
}

void CudaBackend::DoMergeHeadsBackward(const Tensor& dout, const Tensor& dx) {
  Activate();
  ci::PermuteMerge(F(dx), dx.dim(0), dx.dim(1), dx.dim(2), dx.dim(3), F(dout),
                   /*to_merged=*/false, stream());
}

// --- Embedding ---------------------------------------------------------------

absl::Status CudaBackend::DoEmbeddingForward(const Tensor& ids,
                                             const Tensor& table,
                                             const Tensor& out) {
  const int64_t n = ids.numel(), vocab = table.dim(0), d = table.dim(1);
  if (n == 0) return absl::OkStatus();
  Activate();
  ci::ResetScalars(scalars_.get(), stream());
  ci::EmbeddingForward(Ptr<int64_t>(ids), n, F(table), vocab, d, F(out),
                       scalars_.get(), stream());
  // The status depends on the ids, which only the device has read.
  RETURN_IF_ERROR(FetchScalars("embedding"));
  if (host_scalars_->first_bad != ci::kNoBadPosition) {
    const auto i = static_cast<int64_t>(host_scalars_->first_bad);
    ASSIGN_OR_RETURN(int64_t id, FetchId(ids, i));
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " at position ", i,
                     " is outside the vocabulary [0, ", vocab, ")"));
  }
  return absl::OkStatus();
}

void CudaBackend::DoEmbeddingBackward(const Tensor& ids, const Tensor& dy,
                                      const Tensor& dtable) {
  const int64_t n = ids.numel(), vocab = dtable.dim(0), d = dtable.dim(1);
  if (n == 0 || d == 0) return;
  Activate();
  const size_t bytes = ci::EmbeddingBackwardScratchBytes(n, vocab);
  Scratch scratch = ScratchOrDefer(bytes, "EmbeddingBackward");
  if (!scratch.ok()) return;
  ci::EmbeddingBackward(Ptr<int64_t>(ids), n, F(dy), vocab, d, F(dtable),
                        scratch.as<void>(), bytes, stream());
}

// --- Losses ------------------------------------------------------------------

absl::StatusOr<float> CudaBackend::DoMseLoss(const Tensor& y,
                                             const Tensor& target,
                                             float grad_scale,
                                             const Tensor& dy) {
  const int64_t n = y.numel();
  if (n == 0) return 0.0f;
  Activate();
  const float g = grad_scale * 2.0f / static_cast<float>(n);
  ci::MseLoss(F(y), F(target), n, g, F(dy), partials_.get(), scalars_.get(),
              stream());
  RETURN_IF_ERROR(FetchScalars("mse"));
  return static_cast<float>(host_scalars_->sum / static_cast<double>(n));
}

absl::StatusOr<float> CudaBackend::DoCrossEntropyLoss(const Tensor& logits,
                                                      const Tensor& targets,
                                                      float grad_scale,
                                                      const Tensor& dlogits) {
  const int64_t vocab = logits.dim(-1);
  const int64_t n = logits.numel() / std::max<int64_t>(vocab, 1);
  if (n == 0) return 0.0f;
  Activate();
  ASSIGN_OR_RETURN(void* row_loss, allocator_->Allocate(n * sizeof(double)));
  const Scratch scratch(allocator_.get(), row_loss);
  const float g = grad_scale / static_cast<float>(n);
  ci::ResetScalars(scalars_.get(), stream());
  ci::CrossEntropyLoss(F(logits), Ptr<int64_t>(targets), n, vocab, g,
                       F(dlogits), scratch.as<double>(), partials_.get(),
                       scalars_.get(), stream());
  RETURN_IF_ERROR(FetchScalars("cross_entropy"));
  if (host_scalars_->first_bad != ci::kNoBadPosition) {
    const auto i = static_cast<int64_t>(host_scalars_->first_bad);
    ASSIGN_OR_RETURN(int64_t target, FetchId(targets, i));
    return absl::InvalidArgumentError(
        absl::StrCat("cross_entropy: target ", target, " at position ", i,
                     " is outside [0, ", vocab, ")"));
  }
  return static_cast<float>(host_scalars_->sum / static_cast<double>(n));
}

// --- Optimizers --------------------------------------------------------------

void CudaBackend::DoSgdUpdate(const SgdParams& p, const Tensor& param,
                              const Tensor& grad, const Tensor& momentum) {
  Activate();
  ci::SgdUpdate(p, F(param), F(grad),
                p.momentum != 0.0f ? F(momentum) : nullptr, param.numel(),
                stream());
}

void CudaBackend::DoAdamUpdate(const AdamParams& p, const Tensor& param,
                               const Tensor& grad, const Tensor& exp_avg,
                               const Tensor& exp_avg_sq) {
  // The bias corrections in double on the host, exactly as the CPU backend.
  const double bias1 = 1.0 - std::pow(static_cast<double>(p.beta1), p.step);
  const double bias2 = 1.0 - std::pow(static_cast<double>(p.beta2), p.step);
  const float step_size = static_cast<float>(p.lr / bias1);
  const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  Activate();
  ci::AdamUpdate(p, step_size, bias2_sqrt, F(param), F(grad), F(exp_avg),
                 F(exp_avg_sq), param.numel(), stream());
}

absl::StatusOr<double> CudaBackend::SumSquares(const Tensor& x) {
  const int64_t n = x.numel();
  const float* p = F(x);
  if (n == 0) return 0.0;
  Activate();
  ci::SumSquares(p, n, partials_.get(), scalars_.get(), stream());
  RETURN_IF_ERROR(FetchScalars("sum of squares"));
  return host_scalars_->sum;
}

}  // namespace conveyor::engine
