// UploadVector: a tensor on a backend holding a host vector's values, for the
// small host-built tensors (data batches, document layouts, profiling
// inputs) that would otherwise each spell out Empty and CopyFromHost.
#ifndef CONVEYOR_ENGINE_HOST_UPLOAD_H_
#define CONVEYOR_ENGINE_HOST_UPLOAD_H_

#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "engine/backend.h"
#include "engine/tensor.h"

namespace conveyor::engine {

// A tensor of `shape` on `backend` holding `host` (row-major; the caller
// makes host.size() the shape's element count). The backend's errors
// (ResourceExhausted, ...).
template <typename T>
absl::StatusOr<Tensor> UploadVector(Backend* backend, Shape shape,
                                    const std::vector<T>& host) {
  ASSIGN_OR_RETURN(Tensor t, backend->Empty(std::move(shape), DTypeOf<T>()));
  RETURN_IF_ERROR(
      backend->CopyFromHost(host.data(), host.size() * sizeof(T), t));
  return t;
}

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_HOST_UPLOAD_H_
