#include "coordinator/profile_cache.h"

#include <algorithm>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace conveyor::coordinator {

std::string ProfileCache::Key(const std::string& device,
                              const std::string& profile_key) {
  return absl::StrCat(
      device, "\n",
      absl::Hex(absl::Hash<std::string>()(profile_key), absl::kZeroPad16), ":",
      absl::Hex(absl::Hash<std::pair<std::string, int>>()(
                    std::make_pair(profile_key, 1)),
                absl::kZeroPad16));
}

const std::vector<engine::LayerProfile>* ProfileCache::Find(
    const std::string& key) const {
  auto it = profiles_.find(key);
  return it == profiles_.end() ? nullptr : &it->second;
}

void ProfileCache::Put(const std::string& key,
                       std::vector<engine::LayerProfile> layers) {
  if (auto it = profiles_.find(key); it != profiles_.end()) {
    layers_ -= it->second.size();
    order_.erase(std::find(order_.begin(), order_.end(), key));
  }
  layers_ += layers.size();
  profiles_[key] = std::move(layers);
  order_.push_back(key);
  while (!order_.empty() &&
         (static_cast<int>(order_.size()) > std::max(0, max_profiles_) ||
          layers_ > max_layers_)) {
    auto oldest = profiles_.find(order_.front());
    layers_ -= oldest->second.size();
    profiles_.erase(oldest);
    order_.pop_front();
  }
}

}  // namespace conveyor::coordinator
