// The interface between conveyor-worker and its CUDA plugin,
// libconveyor_cuda.so (worker/cuda_plugin.cc): everything the worker needs
// from CUDA, cuBLAS and NCCL, as a table of function pointers behind one
// extern "C" entry point.
//
// Why a plugin: libcublasLt.so has a 94 KiB static TLS segment. Linked into
// the worker, glibc reserves that much thread-local storage at the top of
// every thread's stack, and civetweb (prometheus-cpp's HTTP server) creates
// its threads with about 100 KiB of stack, so pthread_create fails ("null
// context when constructing CivetServer"). A library loaded with dlopen gets
// dynamic TLS instead (allocated with malloc on first use), so the worker
// loads the plugin, and through it cuBLAS, only when a cuda:K device is
// asked for (worker/device_backends.cc).
//
// The table's functions take and return C++ types (absl::Status, std::string,
// engine::Backend, engine::MeshCollective, transport::Channel): the plugin is
// built from the same sources by the same compiler as the worker, so their
// layouts agree. kCudaPluginAbiVersion guards against a plugin of another
// build; bump it whenever this table or a type it passes changes. The plugin
// must stay loaded for the rest of the process: the objects it returns (and
// the tensors their backends allocate) point into its code.
//
// Thread-safety: every function may be called from any thread; the objects
// returned follow their own interfaces' rules.
#ifndef CONVEYOR_WORKER_CUDA_PLUGIN_API_H_
#define CONVEYOR_WORKER_CUDA_PLUGIN_API_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "engine/backend.h"
#include "engine/mesh_collective.h"
#include "engine/precision.h"
#include "transport/channel.h"
#include "worker/nccl_join.h"

namespace conveyor::worker {

inline constexpr uint32_t kCudaPluginAbiVersion = 2;

// The plugin's file name, looked for next to the worker's executable.
inline constexpr char kCudaPluginFileName[] = "libconveyor_cuda.so";
// The entry point's symbol name (see ConveyorCudaPlugin below).
inline constexpr char kCudaPluginEntryName[] = "ConveyorCudaPlugin";

struct CudaPluginApi {
  // kCudaPluginAbiVersion and sizeof(CudaPluginApi) of the plugin's build;
  // checked first, before any other field is read.
  uint32_t abi_version;
  uint32_t struct_size;
  // Whether the plugin was built with NCCL (the last three functions work).
  bool has_nccl;

  // Visible CUDA devices; 0 (not an error) without a GPU or driver.
  absl::Status (*device_count)(int* count);
  // nvidia-smi's form of the device's UUID: "GPU-" and 8-4-4-4-12 hex digits.
  absl::Status (*device_uuid)(int ordinal, std::string* uuid);
  // engine::CudaBackend::Create(ordinal, {.precision = precision}), with its
  // errors.
  absl::Status (*create_backend)(int ordinal, engine::Precision precision,
                                 std::unique_ptr<engine::Backend>* backend);
  // A collective over backends[0..count) (each from create_backend, on
  // distinct devices): NCCL (transport/nccl/nccl_mesh_collective.h).
  absl::Status (*create_mesh_collective)(
      engine::Backend* const* backends, int count,
      std::unique_ptr<engine::MeshCollective>* collective);
  // transport::CreateNcclUniqueId().
  absl::Status (*create_nccl_unique_id)(std::string* id);
  // transport::NcclChannel::Create with `backend` (from create_backend, of
  // join.precision) and the rest from `join`.
  absl::Status (*create_nccl_channel)(
      const NcclJoin& join, engine::Backend* backend,
      std::unique_ptr<transport::Channel>* channel);
};

}  // namespace conveyor::worker

// The plugin's only exported symbol. Never null; the table lives as long as
// the plugin.
extern "C" const conveyor::worker::CudaPluginApi* ConveyorCudaPlugin();

#endif  // CONVEYOR_WORKER_CUDA_PLUGIN_API_H_
