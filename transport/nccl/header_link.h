// HeaderLink: the ordered side channel a P2pChannel announces its tensors
// over, one small message at a time, while the payloads travel over the
// communicator (NCCL). Messages from one rank to another arrive reliably and
// in the order they were sent; that order is what lets a receiver post its
// NCCL receives in the sender's order. The messages are a few hundred bytes
// (transport/nccl/header.h), a few per step and peer.
//
// The worker provides one over the TCP connections its data plane already
// has; InProcessHeaderHub below connects the ranks of one process (tests).
//
// Thread-safety: Send may be called from any thread. The receiver's
// callbacks run on a thread of the link's choosing and must be quick and
// must not call back into the link.
#ifndef CONVEYOR_TRANSPORT_NCCL_HEADER_LINK_H_
#define CONVEYOR_TRANSPORT_NCCL_HEADER_LINK_H_

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace conveyor::transport {

class HeaderLink {
 public:
  // Told about what arrives. Messages from one peer come in order, and none
  // after that peer's OnLinkError.
  class Receiver {
   public:
    virtual ~Receiver() = default;
    virtual void OnMessage(int peer, std::string message) = 0;
    // The link to `peer` broke (its process died, the connection closed):
    // nothing more will come from it. Unavailable naming the peer.
    virtual void OnLinkError(int peer, const absl::Status& status) = 0;
  };

  virtual ~HeaderLink() = default;

  // Starts delivering to `receiver`, first whatever arrived before. Called
  // once. The receiver must stay valid until Stop returns.
  virtual void Start(Receiver* receiver) = 0;
  // Queues `message` for rank `peer` and returns without waiting for it to
  // be delivered. Unavailable once the link to `peer` is known to be broken;
  // messages to a peer that stopped its end are dropped.
  virtual absl::Status Send(int peer, std::string message) = 0;
  // Stops delivering: no callback runs after Stop returns.
  virtual void Stop() = 0;
};

// The header links of the ranks of one process. Send delivers on the
// sender's thread, straight into the receiver's callback (so callbacks of
// one receiver may run on several threads, one at a time).
class InProcessHeaderHub {
 public:
  explicit InProcessHeaderHub(int ranks);
  ~InProcessHeaderHub();

  InProcessHeaderHub(const InProcessHeaderHub&) = delete;
  InProcessHeaderHub& operator=(const InProcessHeaderHub&) = delete;

  // Rank r's end; owned by the hub.
  HeaderLink* link(int rank);

  // Plays a rank whose process died: every other rank's receiver gets
  // OnLinkError for it, and nothing is delivered to or from it afterwards.
  void Disconnect(int rank) ABSL_LOCKS_EXCLUDED(mu_);

  // Messages sent so far from `from` to `to` (tests of the protocol).
  int64_t messages(int from, int to) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class End;
  struct Pending {
    int from;
    std::string message;
  };
  struct RankState {
    HeaderLink::Receiver* receiver = nullptr;
    bool started = false;
    bool stopped = false;
    bool disconnected = false;
    std::deque<Pending> early;  // Arrived before Start.
  };

  absl::Status Deliver(int from, int to, std::string message)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Start(int rank, HeaderLink::Receiver* receiver) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop(int rank) ABSL_LOCKS_EXCLUDED(mu_);

  // Held while a callback runs, so Stop waits for a callback in progress.
  mutable absl::Mutex mu_;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<int64_t>> counts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<End>> ends_;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_NCCL_HEADER_LINK_H_
