#include "transport/nccl/nccl_launch_lock.h"

#include <algorithm>
#include <map>
#include <memory>

namespace conveyor::transport {
namespace {

// The device's mutex; created on first use and never destroyed, so a lock
// may be taken during static destruction too.
absl::Mutex* DeviceMutex(int device) {
  static absl::Mutex* const registry_mu = new absl::Mutex();
  static auto* const by_device =
      new std::map<int, std::unique_ptr<absl::Mutex>>();
  absl::MutexLock lock(registry_mu);
  std::unique_ptr<absl::Mutex>& mu = (*by_device)[device];
  if (mu == nullptr) mu = std::make_unique<absl::Mutex>();
  return mu.get();
}

}  // namespace

NcclLaunchLock::NcclLaunchLock(std::vector<int> devices) {
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  for (int device : devices) {
    absl::Mutex* mu = DeviceMutex(device);
    mu->Lock();
    held_.push_back(mu);
  }
}

NcclLaunchLock::~NcclLaunchLock() {
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) (*it)->Unlock();
}

}  // namespace conveyor::transport
