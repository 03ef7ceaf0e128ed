// FakeCommunicator: CommunicatorInterface on the CPU, for the ranks of one
// process, keeping NCCL's rules strictly (communicator.h): a rank's groups
// run one at a time in launch order, the i-th send between two ranks
// matches the i-th receive, and nothing is buffered, so a send completes
// only once its receive is running on the peer. An ordering mistake that
// could hang real NCCL therefore hangs here every time, deterministically,
// instead of only for large tensors. Tensors live in host memory (a
// host-resident backend's); payloads are copied when both ends run.
//
// Test hooks on the hub play the failures NCCL reports: an asynchronous
// error on one rank, and a rank whose device stops making progress.
//
// Thread-safe: every method takes the hub's mutex.
#ifndef CONVEYOR_TRANSPORT_NCCL_FAKE_COMMUNICATOR_H_
#define CONVEYOR_TRANSPORT_NCCL_FAKE_COMMUNICATOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend.h"
#include "transport/nccl/communicator.h"

namespace conveyor::transport {

class FakeCommunicatorHub {
 public:
  // `host`, a host-resident backend (the CPU backend), allocates the
  // receive buffers and outlives the hub.
  FakeCommunicatorHub(int ranks, engine::Backend* host);
  ~FakeCommunicatorHub();

  FakeCommunicatorHub(const FakeCommunicatorHub&) = delete;
  FakeCommunicatorHub& operator=(const FakeCommunicatorHub&) = delete;

  // Rank r's communicator. The hub outlives it.
  std::unique_ptr<CommunicatorInterface> Create(int rank);

  // From now on rank r's AsyncError and Poll return `status` (NCCL's
  // ncclRemoteError after a peer died, say) and its groups stop.
  void InjectError(int rank, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Rank r's groups stop making progress without an error (a hung device
  // or a peer that died without the network noticing).
  void Freeze(int rank) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t groups_launched(int rank) const ABSL_LOCKS_EXCLUDED(mu_);
  bool aborted(int rank) const ABSL_LOCKS_EXCLUDED(mu_);
  bool closed(int rank) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Comm;
  struct Op {
    P2pOp::Kind kind;
    int peer;
    engine::Tensor tensor;
    uint64_t seq;  // Position among the ops between this pair and direction.
    bool done = false;
  };
  struct Group {
    uint64_t id;
    std::vector<Op> ops;
  };
  struct RankState {
    std::deque<Group> queue;  // Launched, not complete; the front runs.
    std::set<uint64_t> completed;
    std::vector<uint64_t> sends_to, recvs_from;  // By peer.
    uint64_t next_id = 0;
    int64_t launched = 0;
    absl::Status error;
    bool frozen = false;
    bool aborted = false;
    bool closed = false;
  };

  absl::StatusOr<uint64_t> Launch(int rank, const std::vector<P2pOp>& ops)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> Poll(int rank, uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status AsyncError(int rank) ABSL_LOCKS_EXCLUDED(mu_);
  void Abort(int rank) ABSL_LOCKS_EXCLUDED(mu_);
  void Close(int rank) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs every transfer whose two ends are in running groups, and retires
  // finished groups, until nothing changes.
  void ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Running(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  engine::Backend* const host_;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_NCCL_FAKE_COMMUNICATOR_H_
