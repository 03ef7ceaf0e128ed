// PeerRounds: what a P2pChannel rank knows of its peers' part in the rounds
// (p2p_channel.h, "Why rounds"): which ranks are peers, the round each must
// propose next, the proposals that arrived and are not launched yet, which
// peers said goodbye (after how many rounds) or lost their link, and the
// highest round any peer proposed. It checks that each peer's messages come
// in protocol order; it sends nothing and launches nothing.
//
// Not thread-safe: the channel's progress thread owns it.
#ifndef CONVEYOR_TRANSPORT_NCCL_INTERNAL_PEER_ROUNDS_H_
#define CONVEYOR_TRANSPORT_NCCL_INTERNAL_PEER_ROUNDS_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "transport/tensor_header.h"

namespace conveyor::transport::p2p_internal {

class PeerRounds {
 public:
  // `rank` (for error messages) in a job of `world_size` ranks; `peers` are
  // valid (ResolvePeers).
  PeerRounds(int rank, int world_size, const std::vector<int>& peers);

  bool is_peer(int rank) const { return state_[rank].is_peer; }

  // Whether `peer` is a peer that takes part in `round`: one that said
  // goodbye takes part only in the rounds it proposed.
  bool Participates(int peer, uint64_t round) const;

  // The peers taking part in `round` whose proposal for it (the oldest not
  // launched) has not arrived, in rank order.
  std::vector<int> Missing(uint64_t round) const;

  // Whether `peer` needs no more messages: it said goodbye or its link
  // broke.
  bool Gone(int peer) const;

  // The highest round any peer proposed, plus one.
  uint64_t highest_seen() const { return highest_seen_; }

  // The link to `peer` broke. Returns whether that matters: not after its
  // goodbye, nor for a rank that is not a peer.
  bool LinkBroke(int peer);

  // Checks that `peer` may send a round proposal or goodbye at all:
  // FailedPrecondition for a rank that is not a peer (peer lists must be
  // symmetric), Internal after its goodbye.
  absl::Status CheckSender(int peer) const;

  // `peer` said goodbye after proposing `rounds` rounds. Internal unless
  // that is the number it proposed.
  absl::Status Goodbye(int peer, uint64_t rounds);

  // `peer` proposed `round`. Internal unless it is the round it must
  // propose next. The caller files its headers with AddProposal, unless the
  // rank no longer takes part in that round.
  absl::Status Proposal(int peer, uint64_t round);

  // Files the headers of `peer`'s latest proposal: the tensors it sends this
  // rank in that round.
  void AddProposal(int peer, std::vector<TensorHeader> tensors);

  // Takes `peer`'s oldest proposal not launched; Missing must not list it.
  std::vector<TensorHeader> TakeProposal(int peer);

 private:
  struct PeerState {
    bool is_peer = false;
    uint64_t next_proposal = 0;  // The round its next proposal must have.
    // Its proposals of rounds launch_round_, launch_round_ + 1, ...: the
    // headers of the tensors it sends us in each.
    std::deque<std::vector<TensorHeader>> proposals;
    // After its goodbye: it takes part in rounds below this only.
    std::optional<uint64_t> rounds_total;
    bool link_broken = false;
  };

  const int rank_;
  const std::vector<int> peers_;
  std::vector<PeerState> state_;  // By rank.
  uint64_t highest_seen_ = 0;     // Rounds any peer proposed.
};

}  // namespace conveyor::transport::p2p_internal

#endif  // CONVEYOR_TRANSPORT_NCCL_INTERNAL_PEER_ROUNDS_H_
