#include "transport/nccl/internal/peer_rounds.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/nccl/p2p_channel.h"

namespace conveyor::transport {

// Declared in p2p_channel.h: the list PeerRounds is made with.
absl::StatusOr<std::vector<int>> ResolvePeers(int rank, int world_size,
                                              const std::vector<int>& peers) {
  std::vector<int> resolved = peers;
  if (resolved.empty()) {
    for (int r = 0; r < world_size; ++r) {
      if (r != rank) resolved.push_back(r);
    }
  }
  std::sort(resolved.begin(), resolved.end());
  for (size_t i = 0; i < resolved.size(); ++i) {
    const int p = resolved[i];
    if (p < 0 || p >= world_size || p == rank ||
        (i > 0 && resolved[i - 1] == p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, ": bad peer list [",
                       absl::StrJoin(peers, ", "), "] in a job of ", world_size,
                       " ranks (peers must be other ranks, each once)"));
    }
  }
  return resolved;
}

namespace p2p_internal {

PeerRounds::PeerRounds(int rank, int world_size, const std::vector<int>& peers)
    : rank_(rank), peers_(peers), state_(world_size) {
  for (int p : peers_) state_[p].is_peer = true;
}

bool PeerRounds::Participates(int peer, uint64_t round) const {
  const PeerState& p = state_[peer];
  return p.is_peer && (!p.rounds_total || round < *p.rounds_total);
}

std::vector<int> PeerRounds::Missing(uint64_t round) const {
  std::vector<int> missing;
  for (int p : peers_) {
    if (Participates(p, round) && state_[p].proposals.empty()) {
      missing.push_back(p);
    }
  }
  return missing;
}

bool PeerRounds::Gone(int peer) const {
  return state_[peer].rounds_total || state_[peer].link_broken;
}

bool PeerRounds::LinkBroke(int peer) {
  PeerState& p = state_[peer];
  p.link_broken = true;
  return !p.rounds_total && p.is_peer;
}

absl::Status PeerRounds::CheckSender(int peer) const {
  if (!state_[peer].is_peer) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, " got a header message from rank ", peer,
        ", which is not among its peers (peer lists must be symmetric)"));
  }
  if (state_[peer].rounds_total) {
    return absl::InternalError(absl::StrCat("rank ", rank_, ": rank ", peer,
                                            " sent a message after goodbye"));
  }
  return absl::OkStatus();
}

absl::Status PeerRounds::Goodbye(int peer, uint64_t rounds) {
  PeerState& p = state_[peer];
  if (rounds != p.next_proposal) {
    return absl::InternalError(
        absl::StrCat("rank ", rank_, ": rank ", peer, " said goodbye after ",
                     rounds, " rounds but proposed ", p.next_proposal));
  }
  p.rounds_total = rounds;
  return absl::OkStatus();
}

absl::Status PeerRounds::Proposal(int peer, uint64_t round) {
  PeerState& p = state_[peer];
  if (round != p.next_proposal) {
    return absl::InternalError(absl::StrCat("rank ", rank_, ": rank ", peer,
                                            " proposed round ", round,
                                            ", expected ", p.next_proposal));
  }
  ++p.next_proposal;
  highest_seen_ = std::max(highest_seen_, round + 1);
  return absl::OkStatus();
}

void PeerRounds::AddProposal(int peer, std::vector<TensorHeader> tensors) {
  state_[peer].proposals.push_back(std::move(tensors));
}

std::vector<TensorHeader> PeerRounds::TakeProposal(int peer) {
  std::vector<TensorHeader> headers = std::move(state_[peer].proposals.front());
  state_[peer].proposals.pop_front();
  return headers;
}

}  // namespace p2p_internal
}  // namespace conveyor::transport
