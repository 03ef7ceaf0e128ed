#include "transport/nccl/p2p_channel.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "transport/mailbox.h"
#include "transport/nccl/header.h"
#include "transport/nccl/internal/peer_rounds.h"
#include "transport/nccl/internal/poll_pacer.h"
#include "transport/nccl/internal/round.h"

namespace conveyor::transport {
namespace {

using p2p_internal::Clock;
using p2p_internal::InFlight;
using p2p_internal::OutgoingSend;
using p2p_internal::ProposedRound;
using p2p_internal::Received;

int64_t Millis(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

}  // namespace

class P2pChannel::Impl final : public HeaderLink::Receiver {
 public:
  Impl(std::unique_ptr<CommunicatorInterface> comm, HeaderLink* link,
       const P2pChannelOptions& options, std::vector<int> peers)
      : options_(options),
        rank_(comm->rank()),
        world_size_(comm->world_size()),
        comm_(std::move(comm)),
        link_(link),
        peers_(std::move(peers)),
        peer_rounds_(rank_, world_size_, peers_),
        mailbox_(rank_) {}

  ~Impl() override {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    if (thread_.joinable()) thread_.join();
    link_->Stop();
  }

  void Start() {
    link_->Start(this);
    thread_ = std::thread([this] { Run(); });
  }

  absl::Status Send(int to, const Tag& tag, const engine::Tensor& tensor) {
    {
      absl::MutexLock lock(&mu_);
      if (!status_.ok()) return status_;
      if (closing_) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", rank_, " sends on a closing channel"));
      }
    }
    if (to < 0 || to >= world_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, " sends to unknown rank ", to));
    }
    if (tag.job != options_.job) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, " sends the ", ToString(tag), " in job ",
                       options_.job));
    }
    ASSIGN_OR_RETURN(TensorHeader header, MakeTensorHeader(tag, tensor));
    if (header.bytes > options_.max_tensor_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", ToString(tag), " has ", header.bytes,
          " bytes, more than max_tensor_bytes ", options_.max_tensor_bytes));
    }
    if (to == rank_) {
      absl::MutexLock lock(&mu_);
      return FileLocked(tag, tensor, rank_);
    }
    if (!peer_rounds_.is_peer(to)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, " sends the ", ToString(tag),
                       " to rank ", to, ", which is not among its peers (",
                       absl::StrJoin(peers_, ", "), ")"));
    }
    // Records the fence on the caller's stream; never waits for it.
    absl::StatusOr<PreparedSend> payload = comm_->PrepareSend(tensor);
    if (!payload.ok()) {
      return WithContext(payload.status(),
                         absl::StrCat("rank ", rank_, " sending the ",
                                      ToString(tag), " to rank ", to));
    }
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    // The clock only for the observer, as the TCP channel does.
    outbox_.push_back(
        {to, std::move(header), *std::move(payload),
         options_.observer != nullptr ? Clock::now() : Clock::time_point()});
    return absl::OkStatus();
  }

  absl::StatusOr<engine::Tensor> Recv(const Tag& tag,
                                      std::chrono::milliseconds timeout) {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(std::optional<engine::Tensor> arrived,
                     mailbox_.Await(mu_, status_, tag, timeout));
    if (arrived.has_value()) return *std::move(arrived);
    // Say how far the tensor got: a peer that never announced it did not
    // send it (or is hung); an announced one is stuck in transfer.
    auto announced = announced_.find(tag);
    const absl::Status timed_out = mailbox_.TimeoutError(
        tag, timeout,
        announced == announced_.end()
            ? std::string("no peer has announced it")
            : absl::StrCat("announced by rank ", announced->second,
                           ", its transfer has not completed"));
    if (options_.abort_on_recv_timeout) SetStatusLocked(timed_out);
    Observe(DataPlaneObserver::Error::kTimeout);
    return timed_out;
  }

  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      SetStatusLocked(status.ok() ? absl::CancelledError(absl::StrCat(
                                        "rank ", rank_, ": channel aborted"))
                                  : status);
    }
    // The progress thread may be blocked in a Launch: free it now.
    comm_->Interrupt();
  }

  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  Stats stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  // HeaderLink::Receiver: queue for the progress thread, which decodes.
  void OnMessage(int peer, std::string message) override {
    absl::MutexLock lock(&mu_);
    inbox_.push_back({peer, std::move(message), absl::OkStatus()});
  }
  void OnLinkError(int peer, const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    inbox_.push_back(
        {peer, std::string(),
         status.ok() ? absl::UnavailableError("link closed") : status});
  }

 private:
  // A HeaderLink callback, queued for the progress thread.
  struct Incoming {
    int peer;
    std::string message;
    absl::Status link_error;  // Not OK: the link to `peer` broke.
  };

  void SetStatusLocked(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!status_.ok()) return;
    status_ = status;
    // Tensors that arrived are of no use to a failed job; free them now.
    mailbox_.Clear();
  }

  absl::Status FileLocked(const Tag& tag, engine::Tensor tensor, int from)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!status_.ok()) return status_;
    return mailbox_.File(tag, std::move(tensor), from);
  }

  // --- Progress thread -------------------------------------------------------

  void Run() {
    while (true) {
      const absl::Duration wait = pacer_.Next(
          !in_flight_.empty(), launch_round_ < next_round_ || goodbye_sent_);
      std::deque<OutgoingSend> sends;
      std::deque<Incoming> incoming;
      absl::Status status;
      bool closing = false;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !outbox_.empty() || !inbox_.empty() || !status_.ok() ||
                 (closing_ && !closing_seen_);
        };
        mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
        sends.swap(outbox_);
        incoming.swap(inbox_);
        status = status_;
        closing = closing_;
        closing_seen_ = closing_;
      }
      if (!status.ok()) {
        Teardown(status);
        return;
      }
      if (absl::Status s = Step(std::move(sends), std::move(incoming), closing);
          !s.ok()) {
        Fail(s);
        continue;  // The next turn sees the status and tears down.
      }
      if (goodbye_sent_ && launch_round_ == next_round_ && in_flight_.empty()) {
        if (absl::Status s = comm_->Close(options_.linger); !s.ok()) {
          SPDLOG_WARN("transport: rank {} closing its communicator: {}", rank_,
                      s.ToString());
        }
        return;
      }
    }
  }

  absl::Status Step(std::deque<OutgoingSend> sends,
                    std::deque<Incoming> incoming, bool closing) {
    for (Incoming& in : incoming) RETURN_IF_ERROR(HandleIncoming(in));
    RETURN_IF_ERROR(Propose(std::move(sends)));
    if (closing && !goodbye_sent_) RETURN_IF_ERROR(SayGoodbye());
    RETURN_IF_ERROR(LaunchReadyRounds());
    RETURN_IF_ERROR(PollGroups());
    if (absl::Status s = comm_->AsyncError(); !s.ok()) {
      return WithContext(s, absl::StrCat("rank ", rank_, ": communicator"));
    }
    return CheckStalls();
  }

  absl::Status HandleIncoming(const Incoming& in) {
    if (!in.link_error.ok()) {
      // After a goodbye, the link closing is expected; a rank this one
      // exchanges nothing with is its peers' concern.
      if (!peer_rounds_.LinkBroke(in.peer)) return absl::OkStatus();
      Observe(DataPlaneObserver::Error::kPeerLost);
      // The link's code: Unavailable for a lost peer, the original code
      // when the link broke because a rank aborted (TcpHeaderLink), so
      // every rank fails with the reason's code.
      return absl::Status(
          in.link_error.code(),
          absl::StrCat("rank ", rank_, " lost its header link to rank ",
                       in.peer, ": ", in.link_error.message()));
    }
    absl::StatusOr<LinkMessage> decoded =
        DecodeLinkMessage(in.message, options_.job, options_.max_tensor_bytes);
    if (!decoded.ok()) {
      return WithContext(decoded.status(),
                         absl::StrCat("rank ", rank_, ": from rank ", in.peer));
    }
    LinkMessage& m = *decoded;
    if (m.kind == LinkMessageKind::kAbort) {
      return absl::Status(
          m.status.code(),
          absl::StrCat("rank ", in.peer, " aborted: ", m.status.message()));
    }
    RETURN_IF_ERROR(peer_rounds_.CheckSender(in.peer));
    if (m.kind == LinkMessageKind::kGoodbye) {
      RETURN_IF_ERROR(peer_rounds_.Goodbye(in.peer, m.round));
      // A send already proposed for a round it will not take part in would
      // never be received.
      for (const ProposedRound& r : my_rounds_) {
        if (r.round < m.round) continue;
        for (const OutgoingSend& s : r.sends) {
          if (s.to == in.peer) return ClosedPeer(s);
        }
      }
      return absl::OkStatus();
    }
    // A round proposal.
    RETURN_IF_ERROR(peer_rounds_.Proposal(in.peer, m.round));
    // After this rank's goodbye it takes part in no round it did not
    // propose; the peer fails when the goodbye reaches it if it sent us
    // anything there.
    if (goodbye_sent_ && m.round >= next_round_) return absl::OkStatus();
    if (m.round < launch_round_) {
      return absl::InternalError(absl::StrCat(
          "rank ", rank_, ": proposal of round ", m.round, " from rank ",
          in.peer, " arrived after the round was launched"));
    }
    {
      absl::MutexLock lock(&mu_);
      for (const TensorHeader& h : m.tensors) announced_[h.tag] = in.peer;
    }
    peer_rounds_.AddProposal(in.peer, std::move(m.tensors));
    return absl::OkStatus();
  }

  absl::Status ClosedPeer(const OutgoingSend& send) const {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, " sends the ", ToString(send.header.tag),
                     " to rank ", send.to, ", which has closed its channel"));
  }

  // Proposes a round for new sends, and every round a peer has started,
  // so that every round gathers a proposal from every rank taking part.
  absl::Status Propose(std::deque<OutgoingSend> sends) {
    if (goodbye_sent_) return absl::OkStatus();
    while (!sends.empty() || next_round_ < peer_rounds_.highest_seen()) {
      const uint64_t round = next_round_;
      std::vector<LinkMessage> messages(world_size_);
      for (int p : peers_) {
        messages[p] = RoundMessage(options_.job, round, {});
      }
      ProposedRound proposed{round, {}, Clock::now()};
      for (OutgoingSend& s : sends) {
        if (!peer_rounds_.Participates(s.to, round)) return ClosedPeer(s);
        messages[s.to].tensors.push_back(s.header);
        proposed.sends.push_back(std::move(s));
      }
      sends.clear();
      for (int p : peers_) {
        if (!peer_rounds_.Participates(p, round)) continue;
        if (absl::Status s = link_->Send(p, EncodeLinkMessage(messages[p]));
            !s.ok()) {
          return WithContext(
              s, absl::StrCat("rank ", rank_, " proposing round ", round,
                              " to rank ", p));
        }
      }
      my_rounds_.push_back(std::move(proposed));
      ++next_round_;
    }
    return absl::OkStatus();
  }

  absl::Status SayGoodbye() {
    goodbye_sent_ = true;
    close_deadline_ = Clock::now() + options_.linger;
    const std::string goodbye =
        EncodeLinkMessage(GoodbyeMessage(options_.job, next_round_));
    for (int p : peers_) {
      // A peer that left before us needs no goodbye.
      if (peer_rounds_.Gone(p)) continue;
      (void)link_->Send(p, goodbye);
    }
    return absl::OkStatus();
  }

  // Launches every round whose proposals are all in, in round order.
  absl::Status LaunchReadyRounds() {
    while (launch_round_ < next_round_) {
      const uint64_t round = launch_round_;
      if (!peer_rounds_.Missing(round).empty()) {
        return absl::OkStatus();  // Not every proposal is in yet.
      }
      ProposedRound mine = std::move(my_rounds_.front());
      my_rounds_.pop_front();
      ++launch_round_;

      InFlight flight;
      flight.round = round;
      std::vector<P2pOp> ops;
      for (OutgoingSend& s : mine.sends) {
        // Zero-byte tensors need no transfer: the header says it all, on
        // both sides, so the ranks still agree on the operations.
        if (s.header.bytes > 0) {
          ops.push_back(SendOp(s.to, s.payload.tensor, s.payload.fence));
        }
        flight.sends.push_back(std::move(s));
      }
      for (int p : peers_) {
        if (!peer_rounds_.Participates(p, round)) continue;
        std::vector<TensorHeader> headers = peer_rounds_.TakeProposal(p);
        for (const TensorHeader& h : headers) {
          absl::StatusOr<engine::Tensor> buffer =
              comm_->AllocateRecv(h.shape, h.dtype);
          if (!buffer.ok()) {
            return WithContext(buffer.status(),
                               absl::StrCat("rank ", rank_, " receiving the ",
                                            ToString(h.tag), " from rank ", p));
          }
          if (h.bytes > 0) {
            ops.push_back(RecvOp(p, *buffer));
          }
          flight.receives.push_back({h.tag, p, *std::move(buffer)});
        }
      }
      if (!ops.empty()) {
        absl::StatusOr<uint64_t> group = comm_->Launch(ops);
        if (!group.ok()) {
          return WithContext(group.status(),
                             absl::StrCat("rank ", rank_, " launching round ",
                                          round, " (", Describe(flight), ")"));
        }
        flight.group = *group;
      }
      if (in_flight_.empty()) front_since_ = Clock::now();
      in_flight_.push_back(std::move(flight));
      pacer_.Progressed();
      absl::MutexLock lock(&mu_);
      ++stats_.rounds;
      if (!ops.empty()) ++stats_.groups;
    }
    return absl::OkStatus();
  }

  // Files the tensors of completed groups, oldest first: a rank's groups
  // complete in launch order.
  absl::Status PollGroups() {
    while (!in_flight_.empty()) {
      InFlight& flight = in_flight_.front();
      if (flight.group) {
        absl::StatusOr<bool> done = comm_->Poll(*flight.group);
        if (!done.ok()) {
          return WithContext(
              done.status(),
              absl::StrCat("rank ", rank_, ": round ", flight.round, " (",
                           Describe(flight), ")"));
        }
        if (!*done) break;
      }
      // Received tensors are reported before they are filed: a Recv that
      // returns one may be followed at once by a look at the metrics.
      if (options_.observer != nullptr) {
        for (const Received& r : flight.receives) {
          options_.observer->OnReceived(r.from, r.tensor.bytes());
        }
      }
      {
        absl::MutexLock lock(&mu_);
        for (Received& r : flight.receives) {
          announced_.erase(r.tag);
          RETURN_IF_ERROR(FileLocked(r.tag, std::move(r.tensor), r.from));
          ++stats_.received;
        }
        stats_.sent += static_cast<int64_t>(flight.sends.size());
      }
      if (options_.observer != nullptr) {
        const Clock::time_point now = Clock::now();
        for (const OutgoingSend& send : flight.sends) {
          options_.observer->OnSent(send.to, send.payload.tensor.bytes(),
                                    now - send.queued_at);
        }
      }
      in_flight_.pop_front();
      front_since_ = Clock::now();
      pacer_.Progressed();
    }
    return absl::OkStatus();
  }

  void Observe(DataPlaneObserver::Error error) const {
    if (options_.observer != nullptr) options_.observer->OnError(error);
  }

  absl::Status CheckStalls() const {
    const Clock::time_point now = Clock::now();
    const auto stall = options_.stall_timeout;
    if (!in_flight_.empty() && now - front_since_ > stall) {
      const InFlight& f = in_flight_.front();
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank_, ": the transfers of round ", f.round, " (",
          Describe(f), ") made no progress for ", Millis(now - front_since_),
          " ms: a peer is lost or hung"));
    }
    if (!my_rounds_.empty() && now - my_rounds_.front().proposed_at > stall) {
      const uint64_t round = my_rounds_.front().round;
      const std::vector<int> missing = peer_rounds_.Missing(round);
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, ": round ", round, " waited ",
                       Millis(now - my_rounds_.front().proposed_at),
                       " ms for the headers of rank(s) ",
                       absl::StrJoin(missing, ", "), ": lost or hung"));
    }
    if (goodbye_sent_ && now > close_deadline_) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank_, " closing: ", next_round_ - launch_round_,
          " round(s) not launched and ", in_flight_.size(),
          " not completed after ", options_.linger.count(), " ms"));
    }
    return absl::OkStatus();
  }

  // Aborts the communicator, tells the peers, and lets go of the buffers
  // of unfinished groups once the device no longer touches them.
  void Teardown(const absl::Status& status) {
    for (int p : peers_) {
      if (peer_rounds_.Gone(p)) continue;
      (void)link_->Send(p,
                        EncodeLinkMessage(AbortMessage(options_.job, status)));
    }
    comm_->Abort();
    const Clock::time_point deadline = Clock::now() + options_.linger;
    bool quiescent = comm_->Quiescent();
    while (!quiescent && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      quiescent = comm_->Quiescent();
    }
    if (!quiescent && !in_flight_.empty()) {
      // Reusing memory a running kernel may still write would corrupt
      // whatever gets it next; leaking it is the lesser harm.
      SPDLOG_ERROR(
          "transport: rank {}: the device did not let go of {} in-flight "
          "group(s) after the abort; leaking their buffers",
          rank_, in_flight_.size());
      new std::deque<InFlight>(std::move(in_flight_));
    }
    in_flight_.clear();
    my_rounds_.clear();
  }

  const P2pChannelOptions options_;
  const int rank_;
  const int world_size_;
  const std::unique_ptr<CommunicatorInterface> comm_;
  HeaderLink* const link_;
  const std::vector<int> peers_;  // Sorted.

  // Progress thread only.
  p2p_internal::PeerRounds peer_rounds_;
  uint64_t next_round_ = 0;              // Rounds this rank proposed.
  uint64_t launch_round_ = 0;            // Rounds this rank launched.
  std::deque<ProposedRound> my_rounds_;  // Rounds [launch_round_, next_round_).
  std::deque<InFlight> in_flight_;
  Clock::time_point front_since_;  // When in_flight_.front() became the front.
  bool goodbye_sent_ = false;
  Clock::time_point close_deadline_;
  p2p_internal::PollPacer pacer_;

  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  Mailbox mailbox_ ABSL_GUARDED_BY(mu_);
  std::map<Tag, int> announced_ ABSL_GUARDED_BY(mu_);  // Tag -> sender.
  std::deque<OutgoingSend> outbox_ ABSL_GUARDED_BY(mu_);
  std::deque<Incoming> inbox_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_seen_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  // Last member: started last, joined first (in ~Impl).
  std::thread thread_;
};

// ResolvePeers is in internal/peer_rounds.cc, with the peers it lists.

absl::StatusOr<std::unique_ptr<P2pChannel>> P2pChannel::Create(
    std::unique_ptr<CommunicatorInterface> comm, HeaderLink* link,
    const P2pChannelOptions& options) {
  if (comm == nullptr || link == nullptr) {
    return absl::InvalidArgumentError(
        "P2pChannel needs a communicator and a header link");
  }
  const int rank = comm->rank(), world_size = comm->world_size();
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " outside a job of ", world_size, " ranks"));
  }
  ASSIGN_OR_RETURN(std::vector<int> peers,
                   ResolvePeers(rank, world_size, options.peers));
  if (options.stall_timeout <= std::chrono::milliseconds(0) ||
      options.linger < std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(
        "stall_timeout must be positive and linger not negative");
  }
  auto impl =
      std::make_unique<Impl>(std::move(comm), link, options, std::move(peers));
  impl->Start();
  return std::unique_ptr<P2pChannel>(new P2pChannel(std::move(impl)));
}

P2pChannel::P2pChannel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
P2pChannel::~P2pChannel() = default;

absl::Status P2pChannel::Send(int to, const Tag& tag,
                              const engine::Tensor& tensor) {
  return impl_->Send(to, tag, tensor);
}

absl::StatusOr<engine::Tensor> P2pChannel::Recv(
    const Tag& tag, std::chrono::milliseconds timeout) {
  return impl_->Recv(tag, timeout);
}

void P2pChannel::Abort(const absl::Status& status) { impl_->Fail(status); }

absl::Status P2pChannel::status() const { return impl_->status(); }

P2pChannel::Stats P2pChannel::stats() const { return impl_->stats(); }

}  // namespace conveyor::transport
