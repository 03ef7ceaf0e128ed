// ProfileCache: the layer profiles of `stages: auto` jobs, kept for later
// jobs of the same model, microbatch size and device so that they are cut
// without profiling again. Bounded by count and by total layers, oldest
// dropped first, so a stream of huge models cannot grow the coordinator.
//
// Not thread-safe: JobManager holds one under its mutex.
#ifndef CONVEYOR_COORDINATOR_PROFILE_CACHE_H_
#define CONVEYOR_COORDINATOR_PROFILE_CACHE_H_

#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "engine/profiler.h"

namespace conveyor::coordinator {

class ProfileCache {
 public:
  // Layers cached in all by default (40 bytes each).
  static constexpr size_t kDefaultMaxLayers = size_t{1} << 20;

  explicit ProfileCache(int max_profiles, size_t max_layers = kDefaultMaxLayers)
      : max_profiles_(max_profiles), max_layers_(max_layers) {}

  // A fixed-size key for the profile of `profile_key` (engine::ProfileKey,
  // possibly megabytes long) on `device`: the device and two independent
  // 64-bit hashes. The cache lives as long as the process, so absl::Hash's
  // per-process seed is fine.
  static std::string Key(const std::string& device,
                         const std::string& profile_key);

  // nullptr when not cached.
  const std::vector<engine::LayerProfile>* Find(const std::string& key) const;
  // Caches (or replaces) `key`'s profile as the newest, then drops the
  // oldest until within bounds.
  void Put(const std::string& key, std::vector<engine::LayerProfile> layers);

  size_t size() const { return profiles_.size(); }
  size_t layers() const { return layers_; }

 private:
  int max_profiles_;
  size_t max_layers_;
  std::map<std::string, std::vector<engine::LayerProfile>> profiles_;
  std::deque<std::string> order_;  // Oldest first.
  size_t layers_ = 0;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_PROFILE_CACHE_H_
