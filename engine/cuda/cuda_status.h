// CUDA runtime results, turned into absl::Status at the lowest layer, and the
// abort-on-bug check macros for kernels and launchers.
//
// Two ways to handle a cudaError_t, picked by whose fault the failure is:
//
//  - Outside reasons (no device, old driver, out of memory, a bad device
//    index from a config file): convert with CudaStatus() and return it.
//      RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr, bytes), "cudaMalloc"));
//  - A broken invariant inside a kernel launcher (arguments we computed
//    ourselves, a launch that cannot fail unless we have a bug): abort with
//    file:line via CONVEYOR_CUDA_CHECK (host code only). Never use it in code
//    reached from the worker's RPC layer; that layer returns a Status.
//      CONVEYOR_CUDA_CHECK(cudaGetLastError());
//
// CONVEYOR_CUDA_CHECK_GEN(err, success, error_fn) is the generic form that
// cuBLAS and NCCL checks are derived from, e.g. CONVEYOR_NCCL_CHECK(err) would
// be CONVEYOR_CUDA_CHECK_GEN(err, ncclSuccess, ncclGetErrorString).
//
// Thread-safety: all functions are stateless and safe from any thread.
#ifndef CONVEYOR_ENGINE_CUDA_CUDA_STATUS_H_
#define CONVEYOR_ENGINE_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/check.h"

namespace conveyor {

// The status code a caller should act on for `error`:
//   cudaSuccess                                     -> kOk
//   no usable device or driver (cudaErrorNoDevice, cudaErrorInsufficientDriver,
//     cudaErrorStubLibrary, cudaErrorSystemDriverMismatch,
//     cudaErrorCompatNotSupportedOnDevice, cudaErrorNoKernelImageForDevice,
//     cudaErrorUnsupportedPtxVersion)              -> kFailedPrecondition
//     (retrying will not help until the machine or the build is fixed)
//   device busy or not ready yet (cudaErrorDevicesUnavailable,
//     cudaErrorSystemNotReady, cudaErrorNotReady)  -> kUnavailable
//   out of memory or launch resources (cudaErrorMemoryAllocation,
//     cudaErrorLaunchOutOfResources)               -> kResourceExhausted
//   device index out of range (cudaErrorInvalidDevice) -> kInvalidArgument
//   cudaErrorNotPermitted                           -> kPermissionDenied
//   cudaErrorNotSupported                           -> kUnimplemented
//   cudaErrorECCUncorrectable                       -> kDataLoss
//   anything else (including cudaErrorInvalidValue, which means we passed
//     CUDA bad arguments, and the sticky kernel faults)  -> kInternal
absl::StatusCode CudaErrorToStatusCode(cudaError_t error);

// "cudaErrorMemoryAllocation (out of memory)"; for codes this runtime does not
// know, "cudaError_t 12345 (unrecognized error code)".
std::string CudaErrorMessage(cudaError_t error);

// OK for cudaSuccess; otherwise a status with CudaErrorToStatusCode(error) and
// the message "<context>: <CudaErrorMessage(error)>". `context` says what was
// being done, e.g. "cudaMalloc(4096 bytes) on device 0". Pass it the result
// of the call that just failed on this thread: it also clears the thread's
// last error (cudaGetLastError), which the failure set, so that a later
// launch check does not report it again as its own.
absl::Status CudaStatus(cudaError_t error, absl::string_view context);

}  // namespace conveyor

// Evaluates `err` once; unless it equals `success`, aborts with file:line,
// the expression text and error_fn(err) (anything convertible to
// absl::string_view: const char* or std::string).
#define CONVEYOR_CUDA_CHECK_GEN(err, success, error_fn)                       \
  do {                                                                        \
    auto conveyor_check_err_ = (err);                                         \
    if (conveyor_check_err_ != (success)) [[unlikely]] {                      \
      ::conveyor::check_internal::CheckFailed(__FILE__, __LINE__, #err,       \
                                              error_fn(conveyor_check_err_)); \
    }                                                                         \
  } while (false)

// Aborts unless `err` (a cudaError_t expression) is cudaSuccess.
#define CONVEYOR_CUDA_CHECK(err) \
  CONVEYOR_CUDA_CHECK_GEN(err, cudaSuccess, ::conveyor::CudaErrorMessage)

#endif  // CONVEYOR_ENGINE_CUDA_CUDA_STATUS_H_
