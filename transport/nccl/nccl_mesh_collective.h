// The MeshCollective (engine/mesh_collective.h) of a CUDA mesh: the GPUs of
// one worker, each driven by its own GPU backend, joined by one NCCL
// communicator per device (ncclCommInitAll, one process, one thread).
//
//  - ReduceSumToFirst: ncclReduce(sum, root 0) per tensor and device, all in
//    one ncclGroupStart/End, each on its device's compute stream.
//  - BroadcastFromFirst: ncclBroadcast(root 0) likewise.
//  - Copy: cudaMemcpyPeerAsync on the destination's compute stream, after an
//    event recorded on the source's; the source's stream then waits for the
//    copy, so the caching allocator cannot hand the source's block to new
//    work before the copy has read it. Tensors on the host CPU backend go
//    through CopyToHost / CopyFromHost of the device's backend.
//
// Because every collective runs on the compute streams, it is ordered after
// the work already issued there and before the work issued later, without a
// host sync or an extra stream (the ordering engine/mesh_collective.h
// promises).
//
// Thread-compatible, as every MeshCollective. Must be destroyed before its
// backends.
#ifndef CONVEYOR_TRANSPORT_NCCL_NCCL_MESH_COLLECTIVE_H_
#define CONVEYOR_TRANSPORT_NCCL_NCCL_MESH_COLLECTIVE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/mesh_collective.h"

namespace conveyor::engine {
class Backend;
}  // namespace conveyor::engine

namespace conveyor::transport {

// backends[d] computes on device d of the mesh. Returns
//   InvalidArgument: an empty list, a null backend, two on one device (NCCL
//     cannot have two ranks of a communicator on one GPU);
//   the statuses of nccl_status.h / cuda_status.h when NCCL or CUDA fails
//     (e.g. Unavailable when the communicators cannot be set up).
absl::StatusOr<std::unique_ptr<engine::MeshCollective>>
CreateNcclMeshCollective(const std::vector<engine::Backend*>& backends);

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_NCCL_NCCL_MESH_COLLECTIVE_H_
