#include "transport/nccl/header_link.h"

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace conveyor::transport {

class InProcessHeaderHub::End final : public HeaderLink {
 public:
  End(InProcessHeaderHub* hub, int rank) : hub_(hub), rank_(rank) {}

  void Start(Receiver* receiver) override { hub_->Start(rank_, receiver); }
  absl::Status Send(int peer, std::string message) override {
    return hub_->Deliver(rank_, peer, std::move(message));
  }
  void Stop() override { hub_->Stop(rank_); }

 private:
  InProcessHeaderHub* const hub_;
  const int rank_;
};

InProcessHeaderHub::InProcessHeaderHub(int ranks)
    : ranks_(ranks), counts_(ranks, std::vector<int64_t>(ranks, 0)) {
  for (int r = 0; r < ranks; ++r) {
    ends_.push_back(std::make_unique<End>(this, r));
  }
}

InProcessHeaderHub::~InProcessHeaderHub() = default;

HeaderLink* InProcessHeaderHub::link(int rank) {
  CONVEYOR_CHECK(rank >= 0 && rank < static_cast<int>(ends_.size()),
                 "header link of a rank outside the hub");
  return ends_[rank].get();
}

absl::Status InProcessHeaderHub::Deliver(int from, int to,
                                         std::string message) {
  absl::MutexLock lock(&mu_);
  if (to < 0 || to >= static_cast<int>(ranks_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", from, " sends a header to unknown rank ", to));
  }
  if (ranks_[from].disconnected) return absl::OkStatus();  // A dead process.
  if (ranks_[to].disconnected) {
    return absl::UnavailableError(absl::StrCat("header link from rank ", from,
                                               " to rank ", to, " is broken"));
  }
  ++counts_[from][to];
  RankState& target = ranks_[to];
  if (target.stopped) return absl::OkStatus();
  if (!target.started) {
    target.early.push_back({from, std::move(message)});
    return absl::OkStatus();
  }
  target.receiver->OnMessage(from, std::move(message));
  return absl::OkStatus();
}

void InProcessHeaderHub::Start(int rank, HeaderLink::Receiver* receiver) {
  absl::MutexLock lock(&mu_);
  RankState& state = ranks_[rank];
  CONVEYOR_CHECK(!state.started, "HeaderLink::Start called twice");
  state.receiver = receiver;
  state.started = true;
  for (Pending& p : state.early) {
    receiver->OnMessage(p.from, std::move(p.message));
  }
  state.early.clear();
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    if (r != rank && ranks_[r].disconnected) {
      receiver->OnLinkError(
          r, absl::UnavailableError(absl::StrCat("header link from rank ", r,
                                                 " to rank ", rank, " broke")));
    }
  }
}

void InProcessHeaderHub::Stop(int rank) {
  absl::MutexLock lock(&mu_);
  ranks_[rank].stopped = true;
  ranks_[rank].receiver = nullptr;
  ranks_[rank].early.clear();
}

void InProcessHeaderHub::Disconnect(int rank) {
  absl::MutexLock lock(&mu_);
  if (ranks_[rank].disconnected) return;
  ranks_[rank].disconnected = true;
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    RankState& state = ranks_[r];
    if (r == rank || !state.started || state.stopped) continue;
    state.receiver->OnLinkError(
        rank, absl::UnavailableError(absl::StrCat(
                  "header link from rank ", rank, " to rank ", r, " broke")));
  }
}

int64_t InProcessHeaderHub::messages(int from, int to) const {
  absl::MutexLock lock(&mu_);
  return counts_[from][to];
}

}  // namespace conveyor::transport
