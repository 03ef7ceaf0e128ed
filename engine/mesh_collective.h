// MeshCollective: moves tensors between the devices of one worker's mesh,
// for a stage that runs data parallel over them (engine/mesh_stage.h): it
// copies a microbatch's rows to each device and the results back, sums the
// weight gradients onto the first device before the optimizer step and
// copies the updated parameters from it to the others afterwards.
//
// Two implementations:
//  - CreateHostMeshCollective (below): any backends, staged through host
//    memory. Serves CPU meshes (development, CI) and is the reference.
//  - the NCCL one of CUDA meshes (ncclReduce / ncclBroadcast over a
//    communicator of the worker's GPUs, peer copies for rows), created by
//    worker::DeviceBackends.
//
// Every call is ordered after the work already issued on the backends of
// its source tensors, and its results are visible to work issued later on
// the backends of its destinations; a call may return before the copies
// finish (they are queued on the destinations' streams).
//
// Thread-compatible: one thread (the rank's executor) calls it.
#ifndef CONVEYOR_ENGINE_MESH_COLLECTIVE_H_
#define CONVEYOR_ENGINE_MESH_COLLECTIVE_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/tensor.h"

namespace conveyor::engine {

class MeshCollective {
 public:
  virtual ~MeshCollective() = default;

  // Devices in the mesh (>= 1), and the backend computing on device d.
  virtual int size() const = 0;
  virtual Backend* backend(int device) const = 0;

  // Copies `src` into `dst`: same shape and dtype, each on a device of the
  // mesh or on the host CPU backend. InvalidArgument on a mismatch.
  virtual absl::Status Copy(const Tensor& src, const Tensor& dst) = 0;

  // per_tensor[i][d] lives on device d; all of per_tensor[i] have one shape
  // and dtype (f32). Afterwards per_tensor[i][0] holds the sum over d; the
  // others are unchanged. All tensors in one call, so NCCL can group them.
  virtual absl::Status ReduceSumToFirst(
      const std::vector<std::vector<Tensor>>& per_tensor) = 0;

  // Copies per_tensor[i][0] into every per_tensor[i][d].
  virtual absl::Status BroadcastFromFirst(
      const std::vector<std::vector<Tensor>>& per_tensor) = 0;
};

// Staged through host memory: CopyToHost from the source's backend,
// CopyFromHost to the destination's; sums on the host in f32, in device
// order. backends[d] computes on device d; several may be the same backend
// (a CPU mesh for development). InvalidArgument for an empty list or a null
// backend.
absl::StatusOr<std::unique_ptr<MeshCollective>> CreateHostMeshCollective(
    std::vector<Backend*> backends);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_MESH_COLLECTIVE_H_
