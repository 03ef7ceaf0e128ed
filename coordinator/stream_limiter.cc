#include "coordinator/stream_limiter.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace conveyor::coordinator {

StreamLimiter::Slot::Slot(Slot&& other) noexcept
    : limiter_(std::exchange(other.limiter_, nullptr)),
      client_(std::move(other.client_)) {}

StreamLimiter::Slot::~Slot() {
  if (limiter_ != nullptr) limiter_->Release(client_);
}

std::string StreamLimiter::ClientOf(absl::string_view peer) {
  if (const size_t scheme = peer.find(':');
      scheme != absl::string_view::npos &&
      (peer.substr(0, scheme) == "ipv4" || peer.substr(0, scheme) == "ipv6")) {
    peer.remove_prefix(scheme + 1);
    if (const size_t port = peer.rfind(':'); port != absl::string_view::npos) {
      peer = peer.substr(0, port);
    }
  }
  return std::string(peer);
}

std::optional<StreamLimiter::Slot> StreamLimiter::Acquire(
    absl::string_view peer) {
  std::string client = ClientOf(peer);
  MutexLock lock(mu_);
  int& mine = per_client_[client];
  if (total_ >= max_total_ || mine >= max_per_client_) {
    if (mine == 0) per_client_.erase(client);
    return std::nullopt;
  }
  ++mine;
  ++total_;
  return Slot(this, std::move(client));
}

void StreamLimiter::Release(const std::string& client) {
  MutexLock lock(mu_);
  --total_;
  if (auto it = per_client_.find(client);
      it != per_client_.end() && --it->second == 0) {
    per_client_.erase(it);
  }
}

std::string StreamLimiter::Refusal(absl::string_view peer) const {
  const std::string client = ClientOf(peer);
  MutexLock lock(mu_);
  const auto it = per_client_.find(client);
  const int mine = it == per_client_.end() ? 0 : it->second;
  return absl::StrCat("too many open watch streams: ", mine, " from ", client,
                      " (at most ", max_per_client_, " per client) and ",
                      total_, " in all (at most ", max_total_,
                      "); close some, or poll with conveyorctl status");
}

int StreamLimiter::open() const {
  MutexLock lock(mu_);
  return total_;
}

}  // namespace conveyor::coordinator
