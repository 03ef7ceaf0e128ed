#include "worker/device_backends.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/cpu_set.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "worker/cuda_plugin_api.h"

namespace conveyor::worker {
namespace {

constexpr absl::string_view kAllowed =
    "allowed: cpu:N (N >= 1 cores; cpu: all the cores this process may use; "
    "several cpu entries make a CPU mesh) or "
    "cuda:K (GPU ordinal K >= 0; several make a CUDA mesh, and one listed "
    "twice is two devices of the mesh on that GPU), not mixed; a "
    "bare number repeats the kind of the entry before it (cuda:0,1)";

// `text` as a number of at least `min`; -1 otherwise.
int Number(absl::string_view text, int min) {
  int n = -1;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, n);
  return ec == std::errc() && ptr == end && begin != end && n >= min ? n : -1;
}

// Where the plugin is: $CONVEYOR_CUDA_PLUGIN, else next to the executable
// (build/bin/ holds both conveyor-worker and libconveyor_cuda.so), else the
// installed one, whose directory relative to the executable's the build
// defines (cmake/ConveyorInstall.cmake: bin/../lib/<multiarch>/conveyor).
// Relative, not absolute, so that an install under any prefix, or a package
// extracted into a staging directory, loads its own plugin. When neither
// file exists, the installed path is returned, so that the error names where
// the conveyor-cuda package would have put it.
std::string CudaPluginPath() {
  if (const char* path = std::getenv("CONVEYOR_CUDA_PLUGIN");
      path != nullptr && path[0] != '\0') {
    return path;
  }
  std::string exe(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size());
  exe.resize(n > 0 ? static_cast<size_t>(n) : 0);
  const size_t slash = exe.rfind('/');
  std::string dir = slash == std::string::npos ? "." : exe.substr(0, slash);
  const std::string beside = absl::StrCat(dir, "/", kCudaPluginFileName);
#ifdef CONVEYOR_CUDA_PLUGIN_INSTALL_RELDIR
  if (access(beside.c_str(), F_OK) == 0) return beside;
  // Resolve the leading "../" lexically, so the message reads
  // /usr/lib/..., not /usr/bin/../lib/....
  absl::string_view rel = CONVEYOR_CUDA_PLUGIN_INSTALL_RELDIR;
  while (absl::StartsWith(rel, "../")) {
    rel.remove_prefix(3);
    const size_t up = dir.rfind('/');
    dir = up == std::string::npos || up == 0 ? "" : dir.substr(0, up);
  }
  return absl::StrCat(dir, "/", rel, "/", kCudaPluginFileName);
#else
  return beside;
#endif
}

// Loads the plugin (once per file: dlopen counts references to a loaded
// file, and we never dlclose it, because the backends, tensors and channels
// it creates run its code for the rest of the process). RTLD_LOCAL keeps
// its symbols (and cuBLAS's, NCCL's) out of the worker's global namespace;
// RTLD_NOW reports a missing dependency here, not at the first call.
absl::StatusOr<const CudaPluginApi*> LoadCudaPlugin() {
  const std::string path = CudaPluginPath();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load the CUDA plugin ", path, ": ",
        error != nullptr ? error : "unknown dlopen error",
        " (a build puts it next to conveyor-worker, the conveyor-cuda "
        "package in its lib directory; set CONVEYOR_CUDA_PLUGIN to its full "
        "path to load another)"));
  }
  dlerror();  // Clears any earlier error, so a null dlsym result is ours.
  void* entry = dlsym(handle, kCudaPluginEntryName);
  if (entry == nullptr) {
    const char* error = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA plugin ", path, " has no entry point ", kCudaPluginEntryName,
        ": ", error != nullptr ? error : "null symbol"));
  }
  const CudaPluginApi* api =
      reinterpret_cast<const CudaPluginApi* (*)()>(entry)();
  if (api == nullptr || api->abi_version != kCudaPluginAbiVersion ||
      api->struct_size != sizeof(CudaPluginApi)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA plugin ", path, " has ABI version ",
        api == nullptr ? 0 : api->abi_version, " (table of ",
        api == nullptr ? 0 : api->struct_size, " bytes); this worker needs ",
        kCudaPluginAbiVersion, " (", sizeof(CudaPluginApi),
        " bytes): use the plugin built with this conveyor-worker"));
  }
  return api;
}

}  // namespace

bool HaveCudaBackend() {
#ifdef CONVEYOR_HAVE_CUDA_PLUGIN
  return true;
#else
  return false;
#endif
}

class DeviceBackends::Impl {
 public:
  // Ordinals of a CUDA mesh, or each CPU device's cores.
  bool cuda = false;
  std::vector<int> numbers;
  const CudaPluginApi* plugin = nullptr;  // CUDA only.

  absl::Mutex mu;
  // CUDA only: the backend of (device, precision), created on first use.
  std::map<std::pair<int, engine::Precision>, std::unique_ptr<engine::Backend>>
      owned ABSL_GUARDED_BY(mu);

  absl::Status CheckDevice(int device) const {
    if (device < 0 || device >= static_cast<int>(numbers.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", device, " outside the mesh of ",
                       numbers.size(), " devices"));
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<DeviceBackends>> DeviceBackends::Create(
    const std::vector<std::string>& devices) {
  if (devices.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices: empty; ", kAllowed));
  }
  auto impl = std::make_unique<Impl>();
  absl::string_view kind;      // "cpu" or "cuda", from the first entry.
  absl::string_view previous;  // The kind of the entry before.
  for (const std::string& entry : devices) {
    const absl::string_view d = absl::StripAsciiWhitespace(entry);
    absl::string_view this_kind;
    int n = -1;
    if (absl::StartsWith(d, "cuda:")) {
      this_kind = "cuda";
      n = Number(d.substr(5), 0);
    } else if (absl::StartsWith(d, "cpu:")) {
      this_kind = "cpu";
      n = Number(d.substr(4), 1);
    } else if (d == "cpu") {
      // Every core this process may run on (after --cpu-cores or taskset).
      this_kind = "cpu";
      absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
      n = allowed.ok() ? std::max<int>(1, allowed->size()) : 1;
    } else if (!previous.empty()) {
      this_kind = previous;
      n = Number(d, this_kind == "cuda" ? 0 : 1);
    }
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices: '", entry, "' is not supported; ", kAllowed));
    }
    // N is a thread count: a typo must not start a million threads.
    if (this_kind == "cpu" && n > kMaxCpu + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: '", entry, "' asks for ", n,
                       " cores; at most ", kMaxCpu + 1));
    }
    if (kind.empty()) kind = this_kind;
    if (this_kind != kind) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices: '", entry, "' mixes ", this_kind, " with ", kind,
          " devices; a worker's mesh is all CPU or all CUDA; ", kAllowed));
    }
    previous = this_kind;
    impl->numbers.push_back(n);
  }
  impl->cuda = kind == "cuda";
  if (impl->cuda) {
    if (!HaveCudaBackend()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--devices: cuda:", impl->numbers[0],
          ": this conveyor-worker was built without the CUDA plugin (the "
          "CUDA toolkit was not found at build time: see docs/cuda.md); use "
          "cpu:N"));
    }
    absl::StatusOr<const CudaPluginApi*> plugin = LoadCudaPlugin();
    if (!plugin.ok()) {
      return absl::Status(plugin.status().code(),
                          absl::StrCat("--devices: cuda:", impl->numbers[0],
                                       ": ", plugin.status().message()));
    }
    impl->plugin = *plugin;
  }
  return std::unique_ptr<DeviceBackends>(new DeviceBackends(std::move(impl)));
}

DeviceBackends::DeviceBackends(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

// The backends go before anything else of the plugin's; the plugin itself
// stays loaded (LoadCudaPlugin).
DeviceBackends::~DeviceBackends() = default;

int DeviceBackends::size() const {
  return static_cast<int>(impl_->numbers.size());
}

std::string DeviceBackends::device_name(int device) const {
  CONVEYOR_CHECK(impl_->CheckDevice(device).ok(), "device outside the mesh");
  return impl_->cuda ? absl::StrCat("cuda:", impl_->numbers[device]) : "cpu";
}

std::vector<std::string> DeviceBackends::spelled_out() const {
  std::vector<std::string> out;
  for (int n : impl_->numbers) {
    out.push_back(absl::StrCat(impl_->cuda ? "cuda:" : "cpu:", n));
  }
  return out;
}

int DeviceBackends::cpu_threads() const {
  if (impl_->cuda) return 0;
  int threads = 0;
  for (int n : impl_->numbers) threads += n;
  return threads;
}

int DeviceBackends::cuda_device() const {
  return impl_->cuda ? impl_->numbers[0] : -1;
}

absl::StatusOr<std::string> DeviceBackends::device_uuid(int device) {
  RETURN_IF_ERROR(impl_->CheckDevice(device));
  if (!impl_->cuda) return std::string();
  std::string uuid;
  RETURN_IF_ERROR(impl_->plugin->device_uuid(impl_->numbers[device], &uuid));
  return uuid;
}

absl::StatusOr<engine::Backend*> DeviceBackends::Get(
    int device, engine::Precision precision) {
  RETURN_IF_ERROR(impl_->CheckDevice(device));
  // Every device of a CPU mesh computes on the one CPU backend.
  if (!impl_->cuda) return engine::CpuBackend::Get(precision);
  absl::MutexLock lock(&impl_->mu);
  std::unique_ptr<engine::Backend>& backend = impl_->owned[{device, precision}];
  if (backend == nullptr) {
    const int ordinal = impl_->numbers[device];
    absl::Status created =
        impl_->plugin->create_backend(ordinal, precision, &backend);
    if (!created.ok()) {
      impl_->owned.erase({device, precision});
      // Named, for meshes; CudaBackend::Create's messages mostly are already.
      const std::string name = absl::StrCat("cuda:", ordinal);
      if (absl::StartsWith(created.message(), name)) return created;
      return absl::Status(created.code(),
                          absl::StrCat(name, ": ", created.message()));
    }
  }
  return backend.get();
}

absl::StatusOr<std::unique_ptr<engine::MeshCollective>>
DeviceBackends::CreateMeshCollective(int devices, engine::Precision precision) {
  if (devices < 1 || devices > size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a mesh collective over ", devices,
                     " devices; this worker has ", size()));
  }
  std::vector<engine::Backend*> backends;
  for (int d = 0; d < devices; ++d) {
    ASSIGN_OR_RETURN(engine::Backend * backend, Get(d, precision));
    backends.push_back(backend);
  }
  // A plugin without NCCL still gets a working (host-staged) collective,
  // and so does a mesh that lists a GPU more than once (`cuda:0,cuda:0`,
  // to run tensor-parallel ranks on one GPU): NCCL takes one rank a device.
  std::set<int> ordinals;
  for (int d = 0; d < devices; ++d) ordinals.insert(impl_->numbers[d]);
  const bool repeats = static_cast<int>(ordinals.size()) != devices;
  if (!impl_->cuda || !impl_->plugin->has_nccl || repeats) {
    return engine::CreateHostMeshCollective(std::move(backends));
  }
  std::unique_ptr<engine::MeshCollective> collective;
  RETURN_IF_ERROR(impl_->plugin->create_mesh_collective(backends.data(),
                                                        devices, &collective));
  return collective;
}

bool DeviceBackends::nccl_available() const {
  return impl_->cuda && impl_->plugin->has_nccl;
}

absl::StatusOr<std::string> DeviceBackends::CreateNcclUniqueId() {
  if (!nccl_available()) {
    return absl::FailedPreconditionError(
        "NCCL needs a CUDA worker whose plugin was built with NCCL");
  }
  std::string id;
  RETURN_IF_ERROR(impl_->plugin->create_nccl_unique_id(&id));
  return id;
}

absl::StatusOr<std::unique_ptr<transport::Channel>>
DeviceBackends::CreateNcclChannel(const NcclJoin& join) {
  if (!nccl_available()) {
    return absl::FailedPreconditionError(
        "NCCL needs a CUDA worker whose plugin was built with NCCL");
  }
  ASSIGN_OR_RETURN(engine::Backend * backend, Get(0, join.precision));
  std::unique_ptr<transport::Channel> channel;
  RETURN_IF_ERROR(impl_->plugin->create_nccl_channel(join, backend, &channel));
  return channel;
}

}  // namespace conveyor::worker
