#include "transport/in_memory_channel.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/mailbox.h"

namespace conveyor::transport {

class InMemoryHub::Endpoint final : public Channel {
 public:
  Endpoint(InMemoryHub* hub, int rank)
      : hub_(hub), rank_(rank), mailbox_(rank) {}

  absl::Status Send(int to, const Tag& tag,
                    const engine::Tensor& tensor) override {
    {
      absl::MutexLock lock(&mu_);
      if (!aborted_.ok()) return aborted_;
    }
    if (to < 0 || to >= static_cast<int>(hub_->endpoints_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, " sends to unknown rank ", to));
    }
    return hub_->endpoints_[to]->Deliver(tag, tensor, rank_);
  }

  absl::StatusOr<engine::Tensor> Recv(
      const Tag& tag, std::chrono::milliseconds timeout) override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::optional<engine::Tensor>> t =
        mailbox_.Await(mu_, aborted_, tag, timeout);
    if (!t.ok()) return t.status();
    if (!t->has_value()) return mailbox_.TimeoutError(tag, timeout);
    return **std::move(t);
  }

  void Abort(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = status;
    mailbox_.Clear();
  }

 private:
  absl::Status Deliver(const Tag& tag, const engine::Tensor& tensor, int from) {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return aborted_;
    return mailbox_.File(tag, tensor, from);
  }

  InMemoryHub* hub_;
  const int rank_;
  absl::Mutex mu_;
  Mailbox mailbox_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
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
