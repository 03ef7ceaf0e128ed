#include "engine/cuda/cublas_util.h"

#include "absl/strings/str_cat.h"

namespace conveyor {

absl::StatusCode CublasStatusToStatusCode(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return absl::StatusCode::kOk;
    // cublasCreate reports a missing driver or device this way; the handle
    // cannot work until the machine is fixed.
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::StatusCode::kFailedPrecondition;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::StatusCode::kResourceExhausted;
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

std::string CublasStatusMessage(cublasStatus_t status) {
  // Both are plain table lookups: safe without a device.
  return absl::StrCat(cublasGetStatusName(status), " (",
                      cublasGetStatusString(status), ")");
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view context) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string message = CublasStatusMessage(status);
  if (!context.empty()) message = absl::StrCat(context, ": ", message);
  return absl::Status(CublasStatusToStatusCode(status), message);
}

}  // namespace conveyor
