// Compiled by nvcc, so that every CUDA build compiles and links at least one
// real kernel, and the abseil headers are known to pass through nvcc.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"      // defines: RETURN_IF_ERROR
#include "engine/cuda/cuda_handles.h"  // defines: CudaStreamPtr, CudaDevicePtr
#include "engine/cuda/cuda_status.h"   // defines: CudaStatus
#include "engine/cuda/device_info.h"

namespace conveyor {
namespace {

#define CONVEYOR_STRINGIFY_INNER_(x) #x
#define CONVEYOR_STRINGIFY_(x) CONVEYOR_STRINGIFY_INNER_(x)
// The architectures nvcc generated code for, e.g. "900"; from
// CMAKE_CUDA_ARCHITECTURES. Quoted in errors when a kernel has no image for
// the device it runs on.
constexpr char kBuiltArchitectures[] = CONVEYOR_STRINGIFY_(__CUDA_ARCH_LIST__);
#undef CONVEYOR_STRINGIFY_
#undef CONVEYOR_STRINGIFY_INNER_

// Not a multiple of the block size, so the kernel's bounds check matters.
constexpr int kSmokeElements = 1000;
constexpr int kSmokeBlockSize = 256;
constexpr uint32_t kUnwritten = 0xFFFFFFFFu;  // No element's expected value.

// What the kernel writes to element i; the host checks against the same
// function.
__host__ __device__ constexpr uint32_t SmokePattern(uint32_t i) {
  return 3u * i + 1u;
}

__global__ void FillSmokePattern(uint32_t* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = SmokePattern(static_cast<uint32_t>(i));
}

// 13000 -> "13.0", 12040 -> "12.4" (CUDA encodes 1000 * major + 10 * minor).
std::string VersionString(int version) {
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

// The errors with which the runtime says "this machine has no GPU for you".
bool MeansNoDevice(cudaError_t error) {
  return error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver ||
         error == cudaErrorStubLibrary;
}

}  // namespace

absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (MeansNoDevice(error)) {
    // Clear the runtime's last error so that a later
    // CONVEYOR_CUDA_CHECK(cudaGetLastError()) does not trip over it. (A
    // missing driver stays sticky regardless; that is the runtime's choice.)
    (void)cudaGetLastError();
    return std::vector<CudaDeviceInfo>{};
  }
  RETURN_IF_ERROR(CudaStatus(error, "cudaGetDeviceCount"));

  std::vector<CudaDeviceInfo> devices;
  devices.reserve(count);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    RETURN_IF_ERROR(
        CudaStatus(cudaGetDeviceProperties(&prop, i),
                   absl::StrCat("cudaGetDeviceProperties(device ", i, ")")));
    // The maximum SM clock, in kHz, for the MFU's peak (engine/
    // device_peak.h). cudaDeviceProp::clockRate is gone in CUDA 13; the
    // attribute stays.
    int clock_khz = 0;
    RETURN_IF_ERROR(CudaStatus(
        cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, i),
        absl::StrCat("cudaDeviceGetAttribute(ClockRate, device ", i, ")")));
    devices.push_back(CudaDeviceInfo{
        .index = i,
        .name = prop.name,
        .compute_major = prop.major,
        .compute_minor = prop.minor,
        .total_memory_bytes = prop.totalGlobalMem,
        .multiprocessors = prop.multiProcessorCount,
        .clock_khz = clock_khz,
    });
  }
  return devices;
}

std::string CudaRuntimeVersionString() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess || version <= 0) {
    return "unknown";
  }
  return VersionString(version);
}

std::string CudaDriverVersionString() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess || version <= 0) {
    return "none";
  }
  return VersionString(version);
}

absl::Status RunDeviceSmokeTest(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "smoke test on device ", device, ": device ordinals are >= 0"));
  }
  const std::string where = absl::StrCat("smoke test on device ", device);
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device),
                             absl::StrCat(where, ": cudaSetDevice")));

  cudaStream_t raw_stream = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking),
                 absl::StrCat(where, ": cudaStreamCreateWithFlags")));
  const CudaStreamPtr stream(raw_stream);

  constexpr size_t kBytes = kSmokeElements * sizeof(uint32_t);
  void* raw_buffer = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&raw_buffer, kBytes),
                 absl::StrCat(where, ": cudaMalloc(", kBytes, " bytes)")));
  // Declared after `stream`, so it is freed first.
  const CudaDevicePtr<uint32_t> buffer(static_cast<uint32_t*>(raw_buffer));

  // Poison the buffer first so that a kernel which silently did nothing
  // cannot pass on whatever the allocation happened to contain.
  RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(buffer.get(), 0xFF, kBytes, stream.get()),
                 absl::StrCat(where, ": cudaMemsetAsync")));
  constexpr int kBlocks =
      (kSmokeElements + kSmokeBlockSize - 1) / kSmokeBlockSize;
  FillSmokePattern<<<kBlocks, kSmokeBlockSize, 0, stream.get()>>>(
      buffer.get(), kSmokeElements);
  if (const cudaError_t launch = cudaGetLastError(); launch != cudaSuccess) {
    // The usual cause is a device architecture this binary has no kernel
    // image for, so say both.
    int major = 0;
    int minor = 0;
    (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                 device);
    (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                                 device);
    return CudaStatus(
        launch,
        absl::StrCat(where, ": launching a kernel on a compute capability ",
                     major, ".", minor,
                     " device (this binary has kernels for architectures ",
                     kBuiltArchitectures, ")"));
  }

  std::vector<uint32_t> host(kSmokeElements, kUnwritten);
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(host.data(), buffer.get(), kBytes,
                                 cudaMemcpyDeviceToHost, stream.get()),
                 absl::StrCat(where, ": cudaMemcpyAsync")));
  // Faults inside the kernel surface here, as sticky errors.
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream.get()),
                             absl::StrCat(where, ": cudaStreamSynchronize")));

  int wrong = 0;
  int first_wrong = -1;
  for (int i = 0; i < kSmokeElements; ++i) {
    if (host[i] != SmokePattern(static_cast<uint32_t>(i))) {
      if (wrong++ == 0) first_wrong = i;
    }
  }
  if (wrong > 0) {
    return absl::InternalError(absl::StrCat(
        where, ": ", wrong, " of ", kSmokeElements,
        " elements are wrong; element ", first_wrong, " is ", host[first_wrong],
        ", expected ", SmokePattern(static_cast<uint32_t>(first_wrong))));
  }
  return absl::OkStatus();
}

}  // namespace conveyor
