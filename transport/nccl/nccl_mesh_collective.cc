#include "transport/nccl/nccl_mesh_collective.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_handles.h"
#include "engine/cuda/cuda_status.h"
#include "engine/tensor.h"
#include "transport/nccl/nccl_launch_lock.h"
#include "transport/nccl/nccl_status.h"

namespace conveyor::transport {
namespace {

using engine::Backend;

// A device backend's compute stream (engine/backend.h's native handle).
cudaStream_t Stream(const Backend& backend) {
  return static_cast<cudaStream_t>(backend.native_stream());
}
using engine::Tensor;

struct NcclCommDeleter {
  // ncclCommDestroy finishes the operations still queued on the
  // communicator's streams first, so tensors being reduced stay valid.
  void operator()(ncclComm_t comm) const noexcept {
    (void)ncclCommDestroy(comm);
  }
};
using NcclCommPtr =
    std::unique_ptr<std::remove_pointer_t<ncclComm_t>, NcclCommDeleter>;

class NcclMeshCollective final : public engine::MeshCollective {
 public:
  NcclMeshCollective(std::vector<Backend*> backends,
                     std::vector<NcclCommPtr> comms,
                     std::vector<CudaEventPtr> events)
      : backends_(std::move(backends)),
        comms_(std::move(comms)),
        events_(std::move(events)) {}

  int size() const override { return static_cast<int>(backends_.size()); }
  Backend* backend(int device) const override {
    CONVEYOR_CHECK(device >= 0 && device < size(), "mesh device out of range");
    return backends_[device];
  }

  absl::Status Copy(const Tensor& src, const Tensor& dst) override {
    if (!src.defined() || !dst.defined()) {
      return absl::InvalidArgumentError("mesh Copy of an undefined tensor");
    }
    if (src.shape() != dst.shape() || src.dtype() != dst.dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh Copy: source ", engine::ShapeString(src.shape()),
                       " ", engine::DTypeName(src.dtype()), " vs destination ",
                       engine::ShapeString(dst.shape()), " ",
                       engine::DTypeName(dst.dtype())));
    }
    const int from = DeviceOf(src);
    const int to = DeviceOf(dst);
    const size_t bytes = src.bytes();
    if (from >= 0 && to >= 0) {
      if (from == to) {
        backends_[to]->Copy(src, dst);
        return absl::OkStatus();
      }
      if (bytes == 0) return absl::OkStatus();
      Backend* source = backends_[from];
      Backend* destination = backends_[to];
      // The copy runs on the destination's stream, after the source's
      // earlier work (event) and the destination's (same stream), and
      // before the destination's later work. The source's stream then waits
      // for the copy: work it runs later may reuse the source's block.
      RETURN_IF_ERROR(source->RecordEvent(events_[from].get()));
      RETURN_IF_ERROR(destination->WaitForEvent(events_[from].get()));
      RETURN_IF_ERROR(CudaStatus(cudaSetDevice(destination->device_ordinal()),
                                 "cudaSetDevice"));
      RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyPeerAsync(dst.raw(), destination->device_ordinal(),
                              src.raw(), source->device_ordinal(), bytes,
                              Stream(*destination)),
          absl::StrCat("cudaMemcpyPeerAsync(", bytes, " bytes, device ",
                       source->device_ordinal(), " to ",
                       destination->device_ordinal(), ")")));
      RETURN_IF_ERROR(destination->RecordEvent(events_[to].get()));
      return source->WaitForEvent(events_[to].get());
    }
    // One side on the host's CPU backend: those calls are synchronous for
    // the host side, as the Backend contract says.
    if (from >= 0 && IsHost(dst)) {
      return backends_[from]->CopyToHost(src, dst.raw(), bytes);
    }
    if (to >= 0 && IsHost(src)) {
      return backends_[to]->CopyFromHost(src.raw(), bytes, dst);
    }
    if (IsHost(src) && src.backend() == dst.backend()) {
      src.backend()->Copy(src, dst);
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("mesh Copy: tensors on ", src.backend()->Name(), " and ",
                     dst.backend()->Name(),
                     "; each must be on a backend of the mesh or on the CPU"));
  }

  absl::Status ReduceSumToFirst(
      const std::vector<std::vector<Tensor>>& per_tensor) override {
    RETURN_IF_ERROR(Check("ReduceSumToFirst", per_tensor, /*f32_only=*/true));
    return Group("ncclReduce", per_tensor, [&](const Tensor& t, int d) {
      // In place: every device sends its own tensor, the root's receives
      // the sum.
      return ncclReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()),
                        ncclFloat, ncclSum, /*root=*/0, comms_[d].get(),
                        Stream(*backends_[d]));
    });
  }

  absl::Status BroadcastFromFirst(
      const std::vector<std::vector<Tensor>>& per_tensor) override {
    RETURN_IF_ERROR(
        Check("BroadcastFromFirst", per_tensor, /*f32_only=*/false));
    return Group("ncclBroadcast", per_tensor, [&](const Tensor& t, int d) {
      // As bytes, so any dtype goes; the root sends from its own buffer.
      return ncclBroadcast(t.raw(), t.raw(), t.bytes(), ncclChar, /*root=*/0,
                           comms_[d].get(), Stream(*backends_[d]));
    });
  }

 private:
  // The mesh device whose backend owns `t`; -1 for other backends.
  int DeviceOf(const Tensor& t) const {
    for (int d = 0; d < size(); ++d) {
      if (t.backend() == backends_[d]) return d;
    }
    return -1;
  }
  // Asked of the interface, not a dynamic_cast: the CPU backend may be the
  // worker's copy of the class, not this plugin's.
  static bool IsHost(const Tensor& t) {
    return t.backend() != nullptr && t.backend()->host_resident();
  }

  // Validated before the group starts, so no NCCL call fails on our
  // arguments halfway through a group.
  absl::Status Check(absl::string_view what,
                     const std::vector<std::vector<Tensor>>& per_tensor,
                     bool f32_only) const {
    for (size_t i = 0; i < per_tensor.size(); ++i) {
      const std::vector<Tensor>& all = per_tensor[i];
      if (static_cast<int>(all.size()) != size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": tensor ", i, " has ", all.size(),
                         " device copies for a mesh of ", size()));
      }
      for (int d = 0; d < size(); ++d) {
        const Tensor& t = all[d];
        if (!t.defined() || t.backend() != backends_[d]) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, ": tensor ", i, " on device ", d,
              " is not on that device's backend (", backends_[d]->Name(), ")"));
        }
        if (t.shape() != all[0].shape() || t.dtype() != all[0].dtype() ||
            (f32_only && t.dtype() != engine::DType::kF32)) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, ": tensor ", i, " on device ", d, " is ",
              engine::ShapeString(t.shape()), " ", engine::DTypeName(t.dtype()),
              ", device 0's is ", engine::ShapeString(all[0].shape()), " ",
              engine::DTypeName(all[0].dtype()),
              f32_only ? " (f32 only)" : ""));
        }
      }
    }
    return absl::OkStatus();
  }

  // One NCCL group with call(t, d) for every tensor and device: one thread
  // drives every device's communicator, which NCCL allows only inside a
  // group (otherwise the first call would wait for the others forever).
  template <typename Call>
  absl::Status Group(absl::string_view what,
                     const std::vector<std::vector<Tensor>>& per_tensor,
                     Call call) {
    absl::Status status;
    // The channel's progress thread may issue to device 0 meanwhile.
    std::vector<int> devices;
    for (const Backend* b : backends_) devices.push_back(b->device_ordinal());
    NcclLaunchLock launch(std::move(devices));
    RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart"));
    for (const std::vector<Tensor>& all : per_tensor) {
      if (all[0].numel() == 0) continue;
      for (int d = 0; d < size() && status.ok(); ++d) {
        status = NcclStatus(call(all[d], d),
                            absl::StrCat(what, " on ", backends_[d]->Name()),
                            comms_[d].get());
      }
    }
    // Always closed, even after an error, or this thread's next group
    // would nest inside it.
    absl::Status end = NcclStatus(ncclGroupEnd(), absl::StrCat(what, " group"));
    return status.ok() ? end : status;
  }

  const std::vector<Backend*> backends_;
  const std::vector<NcclCommPtr> comms_;
  // events_[d] was created on device d: recorded only on its stream.
  // Reusing one event per device is safe: cudaStreamWaitEvent captures the
  // event's state when it is called.
  const std::vector<CudaEventPtr> events_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<engine::MeshCollective>>
CreateNcclMeshCollective(const std::vector<Backend*>& backends) {
  if (backends.empty()) {
    return absl::InvalidArgumentError("NCCL mesh collective: no backends");
  }
  std::vector<int> devices;
  std::set<int> seen;
  for (Backend* backend : backends) {
    if (backend == nullptr) {
      return absl::InvalidArgumentError("NCCL mesh collective: null backend");
    }
    if (backend->device_ordinal() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NCCL mesh collective: ", backend->Name(), " is not a GPU backend"));
    }
    if (!seen.insert(backend->device_ordinal()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL mesh collective: two backends on cuda:",
                       backend->device_ordinal(), " (one per GPU)"));
    }
    devices.push_back(backend->device_ordinal());
  }
  std::vector<CudaEventPtr> events;
  for (int device : devices) {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
    cudaEvent_t event = nullptr;
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                   absl::StrCat("cudaEventCreate on device ", device)));
    events.emplace_back(event);
  }
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  RETURN_IF_ERROR(NcclStatus(
      ncclCommInitAll(raw.data(), static_cast<int>(devices.size()),
                      devices.data()),
      absl::StrCat("ncclCommInitAll over ", devices.size(), " devices")));
  std::vector<NcclCommPtr> comms;
  for (ncclComm_t comm : raw) comms.emplace_back(comm);
  return std::unique_ptr<engine::MeshCollective>(
      new NcclMeshCollective(backends, std::move(comms), std::move(events)));
}

}  // namespace conveyor::transport
