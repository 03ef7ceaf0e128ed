#include "transport/nccl/nccl_status.h"

#include "absl/strings/str_cat.h"

namespace conveyor {

absl::StatusCode NcclResultToStatusCode(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return absl::StatusCode::kOk;
    // The usual face of a lost peer: its sockets closed, or it reported a
    // failure. The job may run again once the peer is back.
    case ncclSystemError:
    case ncclRemoteError:
    case ncclInProgress:
      return absl::StatusCode::kUnavailable;
    case ncclInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case ncclInvalidUsage:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view context,
                        ncclComm_t comm) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(context, ": ", ncclGetErrorString(result));
  // ncclGetLastError is per thread and may describe an older failure; it is
  // still the only place NCCL says which peer or call failed.
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') {
    absl::StrAppend(&message, " (", last, ")");
  }
  return absl::Status(NcclResultToStatusCode(result), message);
}

}  // namespace conveyor
