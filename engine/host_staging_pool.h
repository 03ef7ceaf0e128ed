// HostStagingPool: reusable host memory for staging a device's tensors, as
// Backend::EmptyHostStaging hands out. The CUDA backend fills it with
// page-locked memory (cudaHostAlloc), which DMA reads and writes directly,
// so the TCP channel's copies between a GPU and its sockets run at full
// speed; allocating page-locked memory costs milliseconds, so blocks are
// kept and reused: a pipeline sends the same shapes step after step.
//
// Blocks are kept by exact size, up to max_cached_bytes in all; a block
// returned beyond that is released at once. Tensors handed out keep the
// pool's memory alive through their release callbacks, so they may outlive
// the pool object (what is cached is released when both are gone).
//
// Thread-safe.
#ifndef CONVEYOR_ENGINE_HOST_STAGING_POOL_H_
#define CONVEYOR_ENGINE_HOST_STAGING_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/tensor.h"

namespace conveyor::engine {

class HostStagingPool {
 public:
  // Allocates `bytes` (> 0) of host memory, or an error (ResourceExhausted
  // when out of memory).
  using Allocate = std::function<absl::StatusOr<void*>(size_t bytes)>;
  using Release = std::function<void(void* data)>;

  HostStagingPool(Allocate allocate, Release release, size_t max_cached_bytes);
  ~HostStagingPool();

  HostStagingPool(const HostStagingPool&) = delete;
  HostStagingPool& operator=(const HostStagingPool&) = delete;

  // An uninitialized tensor of `host` (the CPU backend, whose kernels may
  // read and write it) in pooled memory; empty tensors come from `host`
  // itself. InvalidArgument for a negative or overflowing shape.
  absl::StatusOr<Tensor> Empty(Backend* host, const Shape& shape, DType dtype);

  struct Stats {
    int64_t allocations = 0;  // Calls of Allocate.
    int64_t reuses = 0;       // Tensors served from cached blocks.
    size_t cached_bytes = 0;  // Kept for reuse now.
  };
  Stats stats() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_HOST_STAGING_POOL_H_
