#include "transport/nccl/fake_communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace conveyor::transport {

class FakeCommunicatorHub::Comm final : public CommunicatorInterface {
 public:
  Comm(FakeCommunicatorHub* hub, int rank, int world_size)
      : hub_(hub), rank_(rank), world_size_(world_size) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::StatusOr<PreparedSend> PrepareSend(
      const engine::Tensor& tensor) override {
    if (!tensor.backend()->host_resident()) {
      return absl::InvalidArgumentError(
          "the fake communicator sends CPU tensors only");
    }
    // The CPU backend's work is done when its calls return: no fence.
    return PreparedSend{tensor, nullptr};
  }

  absl::StatusOr<engine::Tensor> AllocateRecv(const engine::Shape& shape,
                                              engine::DType dtype) override {
    return hub_->host_->Empty(shape, dtype);
  }

  absl::StatusOr<uint64_t> Launch(const std::vector<P2pOp>& ops) override {
    return hub_->Launch(rank_, ops);
  }
  absl::StatusOr<bool> Poll(uint64_t id) override {
    return hub_->Poll(rank_, id);
  }
  absl::Status AsyncError() override { return hub_->AsyncError(rank_); }
  void Abort() override { hub_->Abort(rank_); }
  bool Quiescent() override { return true; }
  absl::Status Close(std::chrono::milliseconds /*timeout*/) override {
    hub_->Close(rank_);
    return absl::OkStatus();
  }

 private:
  FakeCommunicatorHub* const hub_;
  const int rank_;
  const int world_size_;
};

FakeCommunicatorHub::FakeCommunicatorHub(int ranks, engine::Backend* host)
    : host_(host), ranks_(ranks) {
  CONVEYOR_CHECK(host != nullptr && host->host_resident(),
                 "the fake communicator needs a host backend");
  for (RankState& r : ranks_) {
    r.sends_to.assign(ranks, 0);
    r.recvs_from.assign(ranks, 0);
  }
}

FakeCommunicatorHub::~FakeCommunicatorHub() = default;

std::unique_ptr<CommunicatorInterface> FakeCommunicatorHub::Create(int rank) {
  absl::MutexLock lock(&mu_);
  CONVEYOR_CHECK(rank >= 0 && rank < static_cast<int>(ranks_.size()),
                 "fake communicator for a rank outside the hub");
  return std::make_unique<Comm>(this, rank, static_cast<int>(ranks_.size()));
}

void FakeCommunicatorHub::InjectError(int rank, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  ranks_[rank].error = status;
}

void FakeCommunicatorHub::Freeze(int rank) {
  absl::MutexLock lock(&mu_);
  ranks_[rank].frozen = true;
}

int64_t FakeCommunicatorHub::groups_launched(int rank) const {
  absl::MutexLock lock(&mu_);
  return ranks_[rank].launched;
}

bool FakeCommunicatorHub::aborted(int rank) const {
  absl::MutexLock lock(&mu_);
  return ranks_[rank].aborted;
}

bool FakeCommunicatorHub::closed(int rank) const {
  absl::MutexLock lock(&mu_);
  return ranks_[rank].closed;
}

absl::StatusOr<uint64_t> FakeCommunicatorHub::Launch(
    int rank, const std::vector<P2pOp>& ops) {
  absl::MutexLock lock(&mu_);
  RankState& state = ranks_[rank];
  CONVEYOR_CHECK(!state.aborted && !state.closed,
                 "launch on an aborted or closed communicator");
  if (!state.error.ok()) return state.error;
  Group group{state.next_id++, {}};
  for (const P2pOp& op : ops) {
    CONVEYOR_CHECK(op.peer >= 0 && op.peer < static_cast<int>(ranks_.size()) &&
                       op.peer != rank,
                   "fake communicator: bad peer");
    CONVEYOR_CHECK(op.tensor.defined() && op.tensor.bytes() > 0,
                   "fake communicator: empty operation");
    uint64_t& counter = op.kind == P2pOp::Kind::kSend
                            ? state.sends_to[op.peer]
                            : state.recvs_from[op.peer];
    group.ops.push_back({op.kind, op.peer, op.tensor, counter++});
  }
  state.queue.push_back(std::move(group));
  ++state.launched;
  ProgressLocked();
  return state.next_id - 1;
}

absl::StatusOr<bool> FakeCommunicatorHub::Poll(int rank, uint64_t id) {
  absl::MutexLock lock(&mu_);
  ProgressLocked();
  const RankState& state = ranks_[rank];
  if (!state.error.ok()) return state.error;
  return state.completed.count(id) > 0;
}

absl::Status FakeCommunicatorHub::AsyncError(int rank) {
  absl::MutexLock lock(&mu_);
  return ranks_[rank].error;
}

void FakeCommunicatorHub::Abort(int rank) {
  absl::MutexLock lock(&mu_);
  // As after ncclCommAbort: this rank's operations are gone; a peer's
  // matching operations never complete.
  ranks_[rank].aborted = true;
  ranks_[rank].queue.clear();
}

void FakeCommunicatorHub::Close(int rank) {
  absl::MutexLock lock(&mu_);
  CONVEYOR_CHECK(ranks_[rank].queue.empty(),
                 "fake communicator closed with groups in flight");
  ranks_[rank].closed = true;
}

bool FakeCommunicatorHub::Running(int rank) const {
  const RankState& s = ranks_[rank];
  return !s.queue.empty() && !s.frozen && !s.aborted && s.error.ok();
}

void FakeCommunicatorHub::ProgressLocked() {
  bool changed = true;
  while (changed) {
    changed = false;
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      if (!Running(r)) continue;
      for (Op& send : ranks_[r].queue.front().ops) {
        if (send.kind != P2pOp::Kind::kSend || send.done) continue;
        // Rendezvous: the matching receive must be in the peer's running
        // group.
        if (!Running(send.peer)) continue;
        for (Op& recv : ranks_[send.peer].queue.front().ops) {
          if (recv.kind != P2pOp::Kind::kRecv || recv.done || recv.peer != r ||
              recv.seq != send.seq) {
            continue;
          }
          // NCCL would hang or corrupt memory; the protocol under test has
          // a bug.
          CONVEYOR_CHECK(recv.tensor.bytes() == send.tensor.bytes(),
                         "fake communicator: send and receive sizes differ");
          std::memcpy(recv.tensor.raw(), send.tensor.raw(),
                      send.tensor.bytes());
          send.done = recv.done = true;
          changed = true;
        }
      }
    }
    for (RankState& s : ranks_) {
      while (!s.queue.empty() && !s.frozen && !s.aborted && s.error.ok()) {
        bool all_done = true;
        for (const Op& op : s.queue.front().ops) all_done &= op.done;
        if (!all_done) break;
        s.completed.insert(s.queue.front().id);
        s.queue.pop_front();
        changed = true;
      }
    }
  }
}

}  // namespace conveyor::transport
