// DeviceBackends: the engine backend a worker computes on, from its
// --devices.
//
//   cpu:N   the CPU backend (N: the cores offered, for the coordinator's
//           listing); one process-wide instance per precision.
//   cuda:K  a CudaBackend on device ordinal K (after CUDA_VISIBLE_DEVICES),
//           only in builds with the CUDA backend. One per precision, created
//           on first use and kept for the worker's life: its cuBLAS handle,
//           stream and cached memory serve job after job.
//
// One device per worker: a mesh (several devices in one worker, splitting a
// stage's microbatches data-parallel) is not built yet; run one worker per
// GPU. Thread-safe.
#ifndef CONVEYOR_WORKER_DEVICE_BACKENDS_H_
#define CONVEYOR_WORKER_DEVICE_BACKENDS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend.h"
#include "engine/precision.h"

namespace conveyor::worker {

// True when this build has the CUDA backend.
bool HaveCudaBackend();

class DeviceBackends {
 public:
  // Parses --devices. InvalidArgument naming the device and the allowed
  // forms; FailedPrecondition for cuda:K in a build without CUDA.
  static absl::StatusOr<std::unique_ptr<DeviceBackends>> Create(
      const std::vector<std::string>& devices);
  ~DeviceBackends();

  DeviceBackends(const DeviceBackends&) = delete;
  DeviceBackends& operator=(const DeviceBackends&) = delete;

  // The backend for `precision`, created on first use. For cuda:K, the
  // errors of CudaBackend::Create (no device, busy, out of memory).
  absl::StatusOr<engine::Backend*> Get(engine::Precision precision);

  // -1 for a CPU worker.
  int cuda_device() const { return cuda_device_; }

 private:
  explicit DeviceBackends(int cuda_device) : cuda_device_(cuda_device) {}

  const int cuda_device_;
  absl::Mutex mu_;
  std::map<engine::Precision, std::unique_ptr<engine::Backend>> owned_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_DEVICE_BACKENDS_H_
