#include "engine/cuda/cuda_status.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace conveyor {

absl::StatusCode CudaErrorToStatusCode(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return absl::StatusCode::kOk;
    // The machine has no usable GPU, or this build cannot run on it: a retry
    // fails the same way until someone installs a driver or rebuilds.
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return absl::StatusCode::kFailedPrecondition;
    // Another process holds the device (exclusive mode), the fabric manager is
    // still starting, or an async operation has not finished: try again later.
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorNotReady:
      return absl::StatusCode::kUnavailable;
    case cudaErrorMemoryAllocation:
    case cudaErrorLaunchOutOfResources:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidDevice:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorNotPermitted:
      return absl::StatusCode::kPermissionDenied;
    case cudaErrorNotSupported:
      return absl::StatusCode::kUnimplemented;
    case cudaErrorECCUncorrectable:
      return absl::StatusCode::kDataLoss;
    default:
      return absl::StatusCode::kInternal;
  }
}

std::string CudaErrorMessage(cudaError_t error) {
  // Neither call needs a driver or initializes the runtime, so this is safe
  // on a machine without a GPU and inside a failing check.
  absl::string_view name = cudaGetErrorName(error);
  absl::string_view description = cudaGetErrorString(error);
  if (!absl::StartsWith(name, "cuda")) {
    // The runtime names unknown codes "unrecognized error code"; keep the
    // number so the code can still be looked up.
    return absl::StrCat("cudaError_t ", static_cast<int>(error), " (",
                        description, ")");
  }
  return absl::StrCat(name, " (", description, ")");
}

absl::Status CudaStatus(cudaError_t error, absl::string_view context) {
  if (error == cudaSuccess) return absl::OkStatus();
  // The failed call also left `error` as this thread's last error. Reported
  // here, it is consumed: otherwise the next launch check on this thread
  // (cudaGetLastError after a kernel launch) would take it for its own and
  // abort, or blame an innocent kernel; on the first GPU run a failed
  // cudaSetDevice of a missing device failed the next smoke test's launch
  // so. Sticky errors (a faulted context) stay sticky regardless.
  (void)cudaGetLastError();
  std::string message = CudaErrorMessage(error);
  if (!context.empty()) message = absl::StrCat(context, ": ", message);
  return absl::Status(CudaErrorToStatusCode(error), message);
}

}  // namespace conveyor
