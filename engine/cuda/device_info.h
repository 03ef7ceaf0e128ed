// What CUDA devices this process can see, and a startup check that one of
// them really runs code built by this binary's nvcc.
//
// A machine with no GPU or no driver is a normal state (CI, laptops, the
// scheduler host): listing returns an empty vector, and only code that needs
// a device fails, with kFailedPrecondition.
//
// Thread-safety: all functions may be called from any thread (the CUDA
// runtime is thread-safe). RunDeviceSmokeTest changes the calling thread's
// current device, as cudaSetDevice does.
#ifndef CONVEYOR_ENGINE_CUDA_DEVICE_INFO_H_
#define CONVEYOR_ENGINE_CUDA_DEVICE_INFO_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor {

struct CudaDeviceInfo {
  int index = 0;          // Ordinal for cudaSetDevice (after
                          // CUDA_VISIBLE_DEVICES is applied).
  std::string name;       // e.g. "NVIDIA H100 80GB HBM3".
  int compute_major = 0;  // Compute capability, e.g. 9.0 for Hopper.
  int compute_minor = 0;
  size_t total_memory_bytes = 0;
  int multiprocessors = 0;  // Streaming multiprocessor count.
  int clock_khz = 0;        // Maximum SM clock.
};

// The visible devices, in ordinal order.
// Returns an empty vector, not an error, when there is no device or no usable
// driver (cudaErrorNoDevice, cudaErrorInsufficientDriver,
// cudaErrorStubLibrary): that is how a GPU-less machine looks.
// Any other CUDA failure is returned as a status (see CudaErrorToStatusCode),
// e.g. kInternal if a visible device cannot be queried.
absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();

// Version of the CUDA runtime this binary runs with, "major.minor" (e.g.
// "13.0"); "unknown" if the runtime cannot say. Needs no driver.
std::string CudaRuntimeVersionString();

// Newest CUDA version the installed driver supports, "major.minor" (e.g.
// "13.0"); "none" when no driver is installed. If it is older than
// CudaRuntimeVersionString(), every device call fails with
// cudaErrorInsufficientDriver.
std::string CudaDriverVersionString();

// Proves that nvcc output, the runtime and `device` all work: makes `device`
// current, allocates a small buffer, fills it with a kernel
// (out[i] = 3 * i + 1), copies it back and checks every element. Everything
// it allocates is freed on every path. Workers run it at startup.
// Returns:
//   kInvalidArgument if `device` is negative or not a visible ordinal;
//   kFailedPrecondition if there is no usable device or driver, or the
//     binary holds no kernel image for this device's architecture;
//   kUnavailable if the device is held by another process (exclusive mode);
//   kResourceExhausted if the device is out of memory;
//   kInternal if the kernel produced wrong values or another CUDA call
//     failed.
absl::Status RunDeviceSmokeTest(int device);

}  // namespace conveyor

#endif  // CONVEYOR_ENGINE_CUDA_DEVICE_INFO_H_
