#include "worker/device_backends.h"

#include <charconv>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#ifdef CONVEYOR_WORKER_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace conveyor::worker {
namespace {

constexpr absl::string_view kAllowed =
    "allowed: cpu:N with N >= 1, or cuda:K with K >= 0 (one device per "
    "worker)";

// The number after `prefix` in `device`, at least `min`; -1 otherwise.
int NumberAfter(const std::string& device, absl::string_view prefix, int min) {
  if (!absl::StartsWith(device, prefix)) return -1;
  int n = -1;
  const char* begin = device.data() + prefix.size();
  const char* end = device.data() + device.size();
  auto [ptr, ec] = std::from_chars(begin, end, n);
  return ec == std::errc() && ptr == end && begin != end && n >= min ? n : -1;
}

}  // namespace

bool HaveCudaBackend() {
#ifdef CONVEYOR_WORKER_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<DeviceBackends>> DeviceBackends::Create(
    const std::vector<std::string>& devices) {
  if (devices.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices: empty; ", kAllowed));
  }
  int cuda = -1;
  for (const std::string& d : devices) {
    const int k = NumberAfter(d, "cuda:", 0);
    if (k < 0 && NumberAfter(d, "cpu:", 1) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: '", d, "' is not supported; ", kAllowed));
    }
    if (k >= 0) cuda = k;
  }
  if (cuda >= 0 && devices.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--devices: ", devices.size(),
        " devices given with a CUDA device; a worker owns one device for now "
        "(meshes of several are not built yet): run one worker per GPU"));
  }
  if (cuda >= 0 && !HaveCudaBackend()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--devices: cuda:", cuda,
        ": this conveyor-worker was built without the CUDA backend (the "
        "CUDA toolkit was not found, or CONVEYOR_WORKER_CUDA is off: see "
        "docs/cuda.md); use cpu:N"));
  }
  return std::unique_ptr<DeviceBackends>(new DeviceBackends(cuda));
}

DeviceBackends::~DeviceBackends() = default;

absl::StatusOr<engine::Backend*> DeviceBackends::Get(
    engine::Precision precision) {
  if (cuda_device_ < 0) return engine::CpuBackend::Get(precision);
#ifdef CONVEYOR_WORKER_CUDA
  absl::MutexLock lock(&mu_);
  std::unique_ptr<engine::Backend>& backend = owned_[precision];
  if (backend == nullptr) {
    engine::CudaBackendOptions options;
    options.precision = precision;
    absl::StatusOr<std::unique_ptr<engine::CudaBackend>> created =
        engine::CudaBackend::Create(cuda_device_, options);
    if (!created.ok()) {
      owned_.erase(precision);
      return created.status();
    }
    backend = *std::move(created);
  }
  return backend.get();
#else
  (void)precision;
  return absl::FailedPreconditionError("built without the CUDA backend");
#endif
}

}  // namespace conveyor::worker
