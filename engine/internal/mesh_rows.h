// Splitting a microbatch's rows over the devices of a mesh and joining them
// back: what MeshStage (data parallel) and TensorParallelStage (one shard
// of rows per replica) share.
#ifndef CONVEYOR_ENGINE_INTERNAL_MESH_ROWS_H_
#define CONVEYOR_ENGINE_INTERNAL_MESH_ROWS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "engine/mesh_collective.h"
#include "engine/tensor.h"

namespace conveyor::engine {

// x's rows split into devices.size() equal shards, shard i copied onto the
// backend of mesh device devices[i] (unless already there). InvalidArgument,
// naming `stage`, `microbatch` and `what` ("input", "output gradient"), for
// a tensor without rows or rows that do not split evenly.
absl::StatusOr<std::vector<Tensor>> SplitRows(MeshCollective& collective,
                                              const std::vector<int>& devices,
                                              const Tensor& x, int stage,
                                              int microbatch, const char* what);

// The parts' rows concatenated in order, on mesh device 0 (the one part
// itself when there is one). Internal for parts whose shapes beyond the rows
// or dtypes differ.
absl::StatusOr<Tensor> ConcatRows(MeshCollective& collective,
                                  const std::vector<Tensor>& parts, int stage);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_INTERNAL_MESH_ROWS_H_
