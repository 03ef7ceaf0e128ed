// DeviceBackends: the devices a worker computes on (its mesh), from
// --devices, and what the worker needs from CUDA and NCCL for them.
//
//   cpu:N             the CPU backend on N cores: its kernels and OpenBLAS
//                     run N threads (engine::SetCpuThreads, which the
//                     worker calls with cpu_threads()); one process-wide
//                     instance per precision. `cpu` alone: every core the
//                     process may run on (its affinity mask).
//   cpu:N,cpu:N,...   a CPU mesh of that many devices that share the CPU: a
//                     stage's microbatches are split over them exactly as
//                     over GPUs (development and CI; no speedup).
//   cuda:K[,L,...]    CudaBackends on device ordinals K, L, ... (after
//                     CUDA_VISIBLE_DEVICES): a mesh when more than one. One
//                     backend per device and precision, created on first use
//                     and kept for the worker's life: cuBLAS handle, stream
//                     and cached memory serve job after job.
//
// The CUDA code (backends, NCCL) is loaded at run time from the CUDA plugin
// (see the .cc) so that a worker without GPUs never loads CUDA libraries.
//
// Thread-safe.
#ifndef CONVEYOR_WORKER_DEVICE_BACKENDS_H_
#define CONVEYOR_WORKER_DEVICE_BACKENDS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend.h"
#include "engine/mesh_collective.h"
#include "engine/precision.h"
#include "transport/channel.h"
#include "transport/nccl/header_link.h"
#include "worker/nccl_join.h"

namespace conveyor::worker {

// True when this build can run CUDA devices (the plugin was built).
bool HaveCudaBackend();

class DeviceBackends {
 public:
  // Parses --devices (one flag value per list entry; the caller splits on
  // commas). InvalidArgument naming the device and the allowed forms (mixed
  // cpu and cuda, a repeated ordinal); FailedPrecondition for cuda:K in a
  // build without the CUDA plugin, or when the plugin cannot be loaded
  // (naming the file and dlerror()).
  static absl::StatusOr<std::unique_ptr<DeviceBackends>> Create(
      const std::vector<std::string>& devices);
  ~DeviceBackends();

  DeviceBackends(const DeviceBackends&) = delete;
  DeviceBackends& operator=(const DeviceBackends&) = delete;

  // Devices in the mesh (>= 1).
  int size() const;
  // "cpu" or "cuda:K" for device d.
  std::string device_name(int device) const;
  // --devices as the coordinator lists them: "cpu:N" or "cuda:K" per
  // device, a bare number or `cpu` spelled out.
  std::vector<std::string> spelled_out() const;
  // The threads a CPU worker's kernels and BLAS get: the sum of its cpu:N
  // (a CPU mesh shares the process's threads); 0 for a CUDA worker.
  int cpu_threads() const;
  // -1 for a CPU worker; the first device's ordinal otherwise.
  int cuda_device() const;
  // The GPU's UUID ("GPU-xxxxxxxx-..."), so the coordinator can tell two
  // workers on one GPU apart from two on different ones; "" for the CPU.
  absl::StatusOr<std::string> device_uuid(int device);

  // The backend of device d for `precision`, created on first use. For CUDA
  // devices the errors of CudaBackend::Create (no device, busy, out of
  // memory). Get(precision) is Get(0, precision).
  absl::StatusOr<engine::Backend*> Get(int device, engine::Precision precision);
  absl::StatusOr<engine::Backend*> Get(engine::Precision precision) {
    return Get(0, precision);
  }

  // A collective over the first `devices` devices' backends for
  // `precision`: CreateHostMeshCollective for CPU meshes, NCCL for CUDA
  // ones. InvalidArgument when devices is outside [1, size()].
  absl::StatusOr<std::unique_ptr<engine::MeshCollective>> CreateMeshCollective(
      int devices, engine::Precision precision);

  // Whether this worker can put its tensors on NCCL: a CUDA worker whose
  // plugin was built with NCCL.
  bool nccl_available() const;
  // A fresh NCCL unique id (transport::CreateNcclUniqueId): rank 0 of a job
  // creates it when the job is prepared. FailedPrecondition when
  // !nccl_available().
  absl::StatusOr<std::string> CreateNcclUniqueId();
  // Joins the job's communicator on device 0 (NcclChannel::Create);
  // FailedPrecondition when !nccl_available().
  absl::StatusOr<std::unique_ptr<transport::Channel>> CreateNcclChannel(
      const NcclJoin& join);

 private:
  class Impl;
  explicit DeviceBackends(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_DEVICE_BACKENDS_H_
