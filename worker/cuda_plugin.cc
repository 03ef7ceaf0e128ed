// libconveyor_cuda.so: the CUDA backend and, when built with it, NCCL, for
// conveyor-worker, behind the table of worker/cuda_plugin_api.h. Loaded by
// worker/device_backends.cc with dlopen; see cuda_plugin_api.h for why.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_status.h"
#include "worker/cuda_plugin_api.h"
#ifdef CONVEYOR_CUDA_PLUGIN_NCCL
#include "transport/nccl/nccl_channel.h"
#include "transport/nccl/nccl_mesh_collective.h"
#endif

namespace conveyor::worker {
namespace {

absl::Status DeviceCount(int* count) {
  *count = 0;
  const cudaError_t error = cudaGetDeviceCount(count);
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver ||
      error == cudaErrorStubLibrary) {
    // How a machine without a GPU looks: not an error.
    *count = 0;
    return absl::OkStatus();
  }
  return CudaStatus(error, "cudaGetDeviceCount");
}

absl::Status DeviceUuid(int ordinal, std::string* uuid) {
  cudaDeviceProp prop = {};
  RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&prop, ordinal),
                 absl::StrCat("cudaGetDeviceProperties(cuda:", ordinal, ")")));
  // nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x",
                  static_cast<unsigned char>(prop.uuid.bytes[i]));
    out += hex;
  }
  *uuid = std::move(out);
  return absl::OkStatus();
}

absl::Status CreateBackend(int ordinal, engine::Precision precision,
                           std::unique_ptr<engine::Backend>* backend) {
  engine::CudaBackendOptions options;
  options.precision = precision;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::CudaBackend> created,
                   engine::CudaBackend::Create(ordinal, options));
  *backend = std::move(created);
  return absl::OkStatus();
}

#ifdef CONVEYOR_CUDA_PLUGIN_NCCL
// The backends handed to us are those create_backend made, so they are
// CudaBackends of this plugin's copy of the class; anything else is a bug
// of the caller, reported rather than trusted.
absl::StatusOr<engine::CudaBackend*> AsCuda(engine::Backend* backend) {
  auto* cuda = dynamic_cast<engine::CudaBackend*>(backend);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a CUDA backend of the plugin: ",
                     backend == nullptr ? "null" : backend->Name()));
  }
  return cuda;
}

absl::Status CreateMeshCollective(
    engine::Backend* const* backends, int count,
    std::unique_ptr<engine::MeshCollective>* collective) {
  std::vector<engine::Backend*> cuda;
  for (int d = 0; d < count; ++d) {
    ASSIGN_OR_RETURN(engine::CudaBackend * b, AsCuda(backends[d]));
    cuda.push_back(b);
  }
  ASSIGN_OR_RETURN(*collective, transport::CreateNcclMeshCollective(cuda));
  return absl::OkStatus();
}

absl::Status CreateNcclUniqueId(std::string* id) {
  ASSIGN_OR_RETURN(*id, transport::CreateNcclUniqueId());
  return absl::OkStatus();
}

absl::Status CreateNcclChannel(const NcclJoin& join, engine::Backend* backend,
                               std::unique_ptr<transport::Channel>* channel) {
  ASSIGN_OR_RETURN(engine::CudaBackend * cuda, AsCuda(backend));
  transport::NcclChannelOptions options;
  options.rank = join.rank;
  options.world_size = join.world_size;
  options.device = cuda->device();
  options.unique_id = join.unique_id;
  options.job = join.job;
  options.peers = join.peers;
  options.header_link = join.header_link;
  options.backend = cuda;
  options.init_timeout = join.init_timeout;
  options.abort_on_recv_timeout = join.abort_on_recv_timeout;
  options.stall_timeout = join.stall_timeout;
  options.observer = join.observer;
  ASSIGN_OR_RETURN(*channel, transport::NcclChannel::Create(options));
  return absl::OkStatus();
}
#else
absl::Status NoNccl() {
  return absl::FailedPreconditionError(
      "the CUDA plugin was built without NCCL (not found at build time)");
}
absl::Status CreateMeshCollective(engine::Backend* const*, int,
                                  std::unique_ptr<engine::MeshCollective>*) {
  return NoNccl();
}
absl::Status CreateNcclUniqueId(std::string*) { return NoNccl(); }
absl::Status CreateNcclChannel(const NcclJoin&, engine::Backend*,
                               std::unique_ptr<transport::Channel>*) {
  return NoNccl();
}
#endif

#ifdef CONVEYOR_CUDA_PLUGIN_NCCL
constexpr bool kHasNccl = true;
#else
constexpr bool kHasNccl = false;
#endif

constexpr CudaPluginApi kApi = {
    .abi_version = kCudaPluginAbiVersion,
    .struct_size = sizeof(CudaPluginApi),
    .has_nccl = kHasNccl,
    .device_count = &DeviceCount,
    .device_uuid = &DeviceUuid,
    .create_backend = &CreateBackend,
    .create_mesh_collective = &CreateMeshCollective,
    .create_nccl_unique_id = &CreateNcclUniqueId,
    .create_nccl_channel = &CreateNcclChannel,
};

}  // namespace
}  // namespace conveyor::worker

extern "C" __attribute__((visibility("default")))
const conveyor::worker::CudaPluginApi*
ConveyorCudaPlugin() {
  return &conveyor::worker::kApi;
}
