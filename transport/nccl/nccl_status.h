// NCCL results, turned into absl::Status at the lowest layer (like
// engine/cuda/cuda_status.h for CUDA), and the abort-on-bug check.
//
//   RETURN_IF_ERROR(NcclStatus(ncclGroupEnd(), "ncclGroupEnd", comm));
//   CONVEYOR_NCCL_CHECK(ncclGroupStart());  // Cannot fail unless we erred.
//
// Thread-safety: stateless functions, safe from any thread.
#ifndef CONVEYOR_TRANSPORT_NCCL_NCCL_STATUS_H_
#define CONVEYOR_TRANSPORT_NCCL_NCCL_STATUS_H_

#include <nccl.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/cuda/cuda_status.h"

namespace conveyor {

// The status code a caller should act on for `result`:
//   ncclSuccess                          -> kOk
//   ncclSystemError (a socket or system call failed: usually a peer process
//     or the network went away), ncclRemoteError (a peer reported a
//     failure), ncclInProgress (not finished yet)  -> kUnavailable
//   ncclInvalidArgument                  -> kInvalidArgument
//   ncclInvalidUsage (e.g. two ranks on one GPU, an API call out of
//     order)                             -> kFailedPrecondition
//   ncclUnhandledCudaError, ncclInternalError, anything else -> kInternal
absl::StatusCode NcclResultToStatusCode(ncclResult_t result);

// OK for ncclSuccess; otherwise "<context>: <ncclGetErrorString(result)>",
// followed by NCCL's last error message when it has one (it names the
// failing peer or call; `comm` may be null).
absl::Status NcclStatus(ncclResult_t result, absl::string_view context,
                        ncclComm_t comm = nullptr);

}  // namespace conveyor

// Aborts with file:line unless `err` (an ncclResult_t expression) is
// ncclSuccess. For calls that fail only through a bug of ours.
#define CONVEYOR_NCCL_CHECK(err) \
  CONVEYOR_CUDA_CHECK_GEN(err, ncclSuccess, ncclGetErrorString)

#endif  // CONVEYOR_TRANSPORT_NCCL_NCCL_STATUS_H_
