#include "transport/in_memory_channel.h"

#include "absl/strings/str_cat.h"

namespace conveyor::transport {

class InMemoryHub::Endpoint final : public Channel {
 public:
  Endpoint(InMemoryHub* hub, int rank) : hub_(hub), rank_(rank) {}

  absl::Status Send(int to, const Tag& tag,
                    const engine::Tensor& tensor) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.ok()) return aborted_;
    }
    if (to < 0 || to >= static_cast<int>(hub_->endpoints_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, " sends to unknown rank ", to));
    }
    return hub_->endpoints_[to]->Deliver(tag, tensor);
  }

  absl::StatusOr<engine::Tensor> Recv(
      const Tag& tag, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    const bool arrived = cv_.wait_for(lock, timeout, [&] {
      return !aborted_.ok() || mailbox_.count(tag) > 0;
    });
    if (!aborted_.ok()) return aborted_;
    if (!arrived) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, " waited ", timeout.count(),
                       " ms for the ", ToString(tag)));
    }
    auto node = mailbox_.extract(tag);
    return std::move(node.mapped());
  }

  void Abort(const absl::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.ok()) aborted_ = status;
      mailbox_.clear();
    }
    cv_.notify_all();
  }

 private:
  absl::Status Deliver(const Tag& tag, const engine::Tensor& tensor) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.ok()) return aborted_;
      if (!mailbox_.emplace(tag, tensor).second) {
        return absl::InternalError(absl::StrCat(
            "rank ", rank_, " received the ", ToString(tag), " twice"));
      }
    }
    cv_.notify_all();
    return absl::OkStatus();
  }

  InMemoryHub* hub_;
  const int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Tag, engine::Tensor> mailbox_;  // Guarded by mu_.
  absl::Status aborted_;                   // Guarded by mu_.
};

InMemoryHub::InMemoryHub(int ranks) {
  for (int r = 0; r < ranks; ++r) {
    endpoints_.push_back(std::make_unique<Endpoint>(this, r));
  }
}

InMemoryHub::~InMemoryHub() = default;

Channel* InMemoryHub::endpoint(int rank) { return endpoints_.at(rank).get(); }

void InMemoryHub::AbortAll(const absl::Status& status) {
  for (auto& e : endpoints_) e->Abort(status);
}

}  // namespace conveyor::transport
