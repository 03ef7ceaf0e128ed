// cuBLAS results as absl::Status, the abort-on-bug check for cuBLAS calls,
// and an owning cuBLAS handle: the cuBLAS counterpart of cuda_status.h and
// cuda_handles.h.
//
//   cublasHandle_t raw = nullptr;
//   RETURN_IF_ERROR(CublasStatus(cublasCreate(&raw), "cublasCreate"));
//   CublasHandlePtr handle(raw);
//   ...
//   CONVEYOR_CUBLAS_CHECK(cublasGemmEx(handle.get(), ...));  // launchers
//
// Thread-safety: the functions are stateless; a handle is used by one thread
// at a time (cuBLAS's rule).
#ifndef CONVEYOR_ENGINE_CUDA_CUBLAS_UTIL_H_
#define CONVEYOR_ENGINE_CUDA_CUBLAS_UTIL_H_

#include <cublas_v2.h>

#include <memory>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/cuda/cuda_status.h"

namespace conveyor {

// The status code a caller should act on for `status`:
//   CUBLAS_STATUS_SUCCESS          -> kOk
//   CUBLAS_STATUS_NOT_INITIALIZED, CUBLAS_STATUS_ARCH_MISMATCH
//                                  -> kFailedPrecondition (no usable driver
//                                     or device; retrying will not help)
//   CUBLAS_STATUS_ALLOC_FAILED     -> kResourceExhausted
//   CUBLAS_STATUS_NOT_SUPPORTED    -> kUnimplemented
//   anything else (INVALID_VALUE is our bug, EXECUTION_FAILED a kernel
//   fault)                         -> kInternal
absl::StatusCode CublasStatusToStatusCode(cublasStatus_t status);

// "CUBLAS_STATUS_ALLOC_FAILED (the resource allocation failed)".
std::string CublasStatusMessage(cublasStatus_t status);

// OK for CUBLAS_STATUS_SUCCESS; otherwise "<context>: <message>" with
// CublasStatusToStatusCode(status).
absl::Status CublasStatus(cublasStatus_t status, absl::string_view context);

struct CublasHandleDeleter {
  void operator()(cublasHandle_t handle) const noexcept {
    (void)cublasDestroy(handle);
  }
};
using CublasHandlePtr =
    std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasHandleDeleter>;

}  // namespace conveyor

// Aborts with file:line unless `err` (a cublasStatus_t expression) is
// CUBLAS_STATUS_SUCCESS. For launchers only, like CONVEYOR_CUDA_CHECK.
#define CONVEYOR_CUBLAS_CHECK(err)                    \
  CONVEYOR_CUDA_CHECK_GEN(err, CUBLAS_STATUS_SUCCESS, \
                          ::conveyor::CublasStatusMessage)

#endif  // CONVEYOR_ENGINE_CUDA_CUBLAS_UTIL_H_
