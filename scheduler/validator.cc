#include "scheduler/validator.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace conveyor::scheduler {
namespace {

// A tensor crossing ranks: the activation F(stage) sends to stage+1, or the
// gradient B/BI(stage) sends to stage-1.
struct Message {
  bool gradient = false;
  int stage = 0;  // The producing stage.
  int microbatch = 0;
  bool operator==(const Message&) const = default;
};

std::string Describe(const Message& m) {
  return m.gradient
             ? absl::StrCat("gradient of stage ", m.stage, " mb ", m.microbatch,
                            " (stage ", m.stage, " -> ", m.stage - 1, ")")
             : absl::StrCat("activation of stage ", m.stage, " mb ",
                            m.microbatch, " (stage ", m.stage, " -> ",
                            m.stage + 1, ")");
}

struct Endpoint {
  int rank;
  int index;  // Action that sends (after it) or receives (before it).
};

class Validator {
 public:
  explicit Validator(const Schedule& s)
      : s_(s), p_(s.ranks), m_(s.microbatches) {}

  std::optional<ScheduleViolation> Run() {
    if (auto v = CheckShape()) return v;
    // Only now is P*V known to be small enough to compute in int.
    num_stages_ = s_.num_stages();
    rank_of_.resize(num_stages_);
    for (int st = 0; st < num_stages_; ++st) rank_of_[st] = s_.RankOfStage(st);
    if (auto v = CheckActions()) return v;
    if (auto v = CheckComplete()) return v;
    if (auto v = CheckMessageOrder()) return v;
    return SendsRendezvous(s_.kind) ? CheckRendezvous() : CheckBuffered();
  }

 private:
  size_t Cell(int stage, int mb) const {
    return static_cast<size_t>(stage) * m_ + mb;
  }
  // Stage must be in [0, num_stages_).
  int Rank(int stage) const { return rank_of_[stage]; }

  ScheduleViolation At(int rank, int index, std::string reason) const {
    return {rank, index, s_.actions[rank][index], std::move(reason)};
  }

  std::optional<ScheduleViolation> CheckShape() const {
    auto bad = [](std::string reason) {
      return ScheduleViolation{-1, -1, {}, std::move(reason)};
    };
    if (p_ < 1) return bad(absl::StrCat("ranks must be >= 1, got ", p_));
    if (s_.virtual_stages < 1) {
      return bad(
          absl::StrCat("virtual stages must be >= 1, got ", s_.virtual_stages));
    }
    if (m_ < 1) return bad(absl::StrCat("microbatches must be >= 1, got ", m_));
    if (s_.StageMicrobatches() > kMaxStageMicrobatches) {
      return bad(absl::StrCat("P*V*M = ", s_.StageMicrobatches(),
                              " stage-microbatches is too large (at most ",
                              kMaxStageMicrobatches, ")"));
    }
    if (static_cast<int>(s_.actions.size()) != p_) {
      return bad(absl::StrCat("schedule lists ", s_.actions.size(),
                              " ranks but declares ", p_));
    }
    return std::nullopt;
  }

  std::optional<ScheduleViolation> CheckActions() {
    const size_t cells = static_cast<size_t>(num_stages_) * m_;
    fwd_.assign(cells, 0);
    full_.assign(cells, 0);
    input_.assign(cells, 0);
    weight_.assign(cells, 0);
    for (int r = 0; r < p_; ++r) {
      const auto& program = s_.actions[r];
      for (int i = 0; i < static_cast<int>(program.size()); ++i) {
        const Action& a = program[i];
        const int st = a.stage, mb = a.microbatch;
        if (st < 0 || st >= num_stages_) {
          return At(r, i,
                    absl::StrCat("stage ", st, " is out of range (0..",
                                 num_stages_ - 1, ")"));
        }
        if (mb < 0 || mb >= m_) {
          return At(r, i,
                    absl::StrCat("microbatch ", mb, " is out of range (0..",
                                 m_ - 1, ")"));
        }
        if (Rank(st) != r) {
          return At(r, i,
                    absl::StrCat("stage ", st, " lives on rank ", Rank(st),
                                 ", not rank ", r));
        }
        const size_t c = Cell(st, mb);
        switch (a.op) {
          case Op::kForward:
            if (fwd_[c]) return At(r, i, "appears more than once");
            if (st > 0 && Rank(st - 1) == r && !fwd_[Cell(st - 1, mb)]) {
              return At(r, i,
                        absl::StrCat("runs before ",
                                     ToString(Action{Op::kForward, st - 1, mb}),
                                     ", which produces its input"));
            }
            fwd_[c] = 1;
            break;
          case Op::kBackward:
          case Op::kBackwardInput: {
            if (s_.forward_only) {
              return At(r, i, "is a backward in a forward-only schedule");
            }
            unsigned char& seen = a.op == Op::kBackward ? full_[c] : input_[c];
            if (seen) return At(r, i, "appears more than once");
            if ((a.op == Op::kBackward && (input_[c] || weight_[c])) ||
                (a.op == Op::kBackwardInput && full_[c])) {
              return At(r, i,
                        "mixes a full backward (B) with a split one (BI/BW) "
                        "for the same stage and microbatch");
            }
            if (!fwd_[c]) {
              return At(r, i,
                        absl::StrCat("runs before its forward ",
                                     ToString(Action{Op::kForward, st, mb})));
            }
            if (st + 1 < num_stages_ && Rank(st + 1) == r &&
                !full_[Cell(st + 1, mb)] && !input_[Cell(st + 1, mb)]) {
              return At(r, i,
                        absl::StrCat("runs before the backward of stage ",
                                     st + 1, " mb ", mb,
                                     ", which produces its output gradient"));
            }
            seen = 1;
            break;
          }
          case Op::kBackwardWeight:
            if (s_.forward_only) {
              return At(r, i, "is a backward in a forward-only schedule");
            }
            if (weight_[c]) return At(r, i, "appears more than once");
            if (full_[c]) {
              return At(r, i,
                        "mixes a full backward (B) with a split one (BI/BW) "
                        "for the same stage and microbatch");
            }
            if (!input_[c]) {
              return At(
                  r, i,
                  absl::StrCat("runs before ",
                               ToString(Action{Op::kBackwardInput, st, mb})));
            }
            weight_[c] = 1;
            break;
        }
      }
    }
    return std::nullopt;
  }

  std::optional<ScheduleViolation> CheckComplete() const {
    auto missing = [](int r, Action a, const char* what) {
      return ScheduleViolation{r, -1, a, absl::StrCat("is missing", what)};
    };
    for (int r = 0; r < p_; ++r) {
      for (int st : StagesOfRank(s_.placement, r, p_, num_stages_)) {
        for (int mb = 0; mb < m_; ++mb) {
          const size_t c = Cell(st, mb);
          if (!fwd_[c]) return missing(r, {Op::kForward, st, mb}, "");
          if (full_[c] || s_.forward_only) continue;
          if (!input_[c] && !weight_[c]) {
            return missing(r, {Op::kBackward, st, mb}, " (or BI and BW)");
          }
          if (!weight_[c]) {
            return missing(r, {Op::kBackwardWeight, st, mb},
                           " (its BI is present)");
          }
        }
      }
    }
    return std::nullopt;
  }

  // A tensor crossing ranks, by number: 2 * Cell(producing stage, mb), plus
  // one for a gradient. Every message is sent at most once (CheckActions), so
  // per-message arrays replace per-channel sequences.
  int MessageId(bool gradient, int stage, int mb) const {
    return 2 * static_cast<int>(Cell(stage, mb)) + (gradient ? 1 : 0);
  }
  Message MessageOf(int id) const {
    const int cell = id / 2;
    return {(id & 1) != 0, cell / m_, cell % m_};
  }

  // One side of a cross-rank transfer: the peer rank (-1: the action
  // transfers nothing that way), the message and its channel.
  struct Transfer {
    int peer = -1;
    int message = -1;
    int channel = -1;
  };

  // One in-order channel per sender, receiver and direction, matching the
  // two streams of the executor model: activations and gradients never share
  // an order, even with P = 2 where both go to the same peer. Every
  // placement sends only to the next or the previous rank (mod P), so a
  // sender has at most four channels.
  int Channel(int from, int to, bool gradient) const {
    const int side = to == from + 1 || (to == 0 && from == p_ - 1) ? 0 : 1;
    return 4 * from + 2 * side + (gradient ? 1 : 0);
  }

  // The message action `a` on rank r sends after it runs, if any.
  Transfer SendOf(const Action& a, int r) const {
    if (a.op == Op::kForward) {
      if (a.stage + 1 < num_stages_ && Rank(a.stage + 1) != r) {
        const int to = Rank(a.stage + 1);
        return {to, MessageId(false, a.stage, a.microbatch),
                Channel(r, to, false)};
      }
    } else if (ProducesInputGradient(a.op) && a.stage > 0 &&
               Rank(a.stage - 1) != r) {
      const int to = Rank(a.stage - 1);
      return {to, MessageId(true, a.stage, a.microbatch), Channel(r, to, true)};
    }
    return {};
  }

  // The message action `a` on rank r must receive before it runs, if any.
  Transfer RecvOf(const Action& a, int r) const {
    if (a.op == Op::kForward) {
      if (a.stage > 0 && Rank(a.stage - 1) != r) {
        const int from = Rank(a.stage - 1);
        return {from, MessageId(false, a.stage - 1, a.microbatch),
                Channel(from, r, false)};
      }
    } else if (ProducesInputGradient(a.op) && a.stage + 1 < num_stages_ &&
               Rank(a.stage + 1) != r) {
      const int from = Rank(a.stage + 1);
      return {from, MessageId(true, a.stage + 1, a.microbatch),
              Channel(from, r, true)};
    }
    return {};
  }

  // The message sent k-th on `channel`, if that many are sent. Only for
  // error reports: it rescans the sender's program.
  std::optional<Message> SentAt(int channel, int k) const {
    const int from = channel / 4;
    for (const Action& a : s_.actions[from]) {
      const Transfer send = SendOf(a, from);
      if (send.peer >= 0 && send.channel == channel && k-- == 0) {
        return MessageOf(send.message);
      }
    }
    return std::nullopt;
  }

  // Checks that, on every channel, the k-th tensor sent is the k-th tensor
  // expected, and builds the streams (see the header).
  std::optional<ScheduleViolation> CheckMessageOrder() {
    const size_t messages = 2 * static_cast<size_t>(num_stages_) * m_;
    const bool buffered = !SendsRendezvous(s_.kind);
    // Each message's position among its channel's sends and, for the
    // buffered-send check, the action that sends it.
    send_position_.assign(messages, -1);
    if (buffered) sender_.assign(messages, Endpoint{-1, -1});
    std::vector<int> sent(4 * p_, 0), received(4 * p_, 0);
    for (int r = 0; r < p_; ++r) {
      const auto& program = s_.actions[r];
      for (int i = 0; i < static_cast<int>(program.size()); ++i) {
        const Transfer send = SendOf(program[i], r);
        if (send.peer < 0) continue;
        send_position_[send.message] = sent[send.channel]++;
        if (buffered) sender_[send.message] = {r, i};
      }
    }
    streams_.assign(2 * p_, {});
    recv_code_.assign(p_, {});
    if (buffered) sender_of_.assign(p_, {});
    // Receives are visited by rank, then position, so the first mismatch
    // found is the one whose receiving action comes first: the answer does
    // not depend on channel numbering. On a channel, receives come in
    // position order, so it is also that channel's first mismatch.
    for (int r = 0; r < p_; ++r) {
      const auto& program = s_.actions[r];
      const int n = static_cast<int>(program.size());
      recv_code_[r].assign(n, -1);
      if (buffered) sender_of_[r].assign(n, Endpoint{-1, -1});
      // A stream holds at most one group per activation (or gradient) the
      // rank sends or receives: about half its actions each.
      streams_[2 * r].reserve(n / 2 + 1);
      streams_[2 * r + 1].reserve(n / 2 + 1);
      // Whether the newest group on each stream is a send still waiting for
      // the next receive to pair with.
      bool open[2] = {false, false};
      for (int i = 0; i < n; ++i) {
        const Action& a = program[i];
        if (const Transfer recv = RecvOf(a, r); recv.peer >= 0) {
          const int k = received[recv.channel]++;
          if (send_position_[recv.message] != k) {
            return Mismatch(r, i, recv, k);
          }
          const int d = recv.message & 1;
          auto& stream = streams_[2 * r + d];
          if (!open[d]) stream.push_back({});
          open[d] = false;
          stream.back().recv_message = recv.message;
          stream.back().recv_peer = recv.peer;
          recv_code_[r][i] = 2 * (static_cast<int>(stream.size()) - 1) + d;
          if (buffered) sender_of_[r][i] = sender_[recv.message];
        }
        if (const Transfer send = SendOf(a, r); send.peer >= 0) {
          const int d = send.message & 1;
          auto& stream = streams_[2 * r + d];
          stream.push_back({.send_action = i,
                            .send_message = send.message,
                            .send_peer = send.peer});
          open[d] = true;
        }
      }
    }
    return std::nullopt;
  }

  ScheduleViolation Mismatch(int r, int i, const Transfer& recv, int k) const {
    const int from = recv.peer;
    const std::optional<Message> sent = SentAt(recv.channel, k);
    return At(
        r, i,
        absl::StrCat("its input is message #", k, " from rank ", from,
                     ", expected to be the ", Describe(MessageOf(recv.message)),
                     ", but rank ", from, " sends the ",
                     sent ? Describe(*sent) : std::string("nothing"),
                     " at that position; in-order transports (NCCL) "
                     "would deliver the wrong tensor"));
  }

  // With buffered sends (a send never waits; see SendsRendezvous) a rank
  // stops only at an action whose input has not been sent: the schedule
  // deadlocks exactly when some action waits, directly or through a chain,
  // on itself.
  std::optional<ScheduleViolation> CheckBuffered() const {
    std::vector<int> computed(p_, 0);
    std::vector<std::vector<int>> waiters(p_);
    std::vector<int> work(p_);
    for (int r = 0; r < p_; ++r) work[r] = p_ - 1 - r;
    auto blocker = [&](int r) -> const Endpoint* {
      const Endpoint& from = sender_of_[r][computed[r]];
      return from.rank >= 0 && computed[from.rank] <= from.index ? &from
                                                                 : nullptr;
    };
    while (!work.empty()) {
      const int r = work.back();
      work.pop_back();
      const int n = static_cast<int>(s_.actions[r].size());
      const int before = computed[r];
      while (computed[r] < n) {
        if (const Endpoint* from = blocker(r)) {
          waiters[from->rank].push_back(r);
          break;
        }
        ++computed[r];
      }
      if (computed[r] != before) {
        for (int w : waiters[r]) work.push_back(w);
        waiters[r].clear();
      }
    }
    for (int r = 0; r < p_; ++r) {
      if (computed[r] == static_cast<int>(s_.actions[r].size())) continue;
      // Follow who waits for whom until a rank repeats.
      std::vector<unsigned char> visited(p_, 0);
      std::string chain;
      for (int at = r; !visited[at];) {
        visited[at] = 1;
        const Endpoint& from = sender_of_[at][computed[at]];
        absl::StrAppend(&chain, chain.empty() ? "" : "; ", "rank ", at, "'s ",
                        ToString(s_.actions[at][computed[at]]),
                        " waits for rank ", from.rank, "'s ",
                        ToString(s_.actions[from.rank][from.index]));
        at = from.rank;
      }
      return At(r, computed[r],
                absl::StrCat("deadlocks even with buffered sends (every "
                             "action waits on another in a cycle): ",
                             chain));
    }
    return std::nullopt;
  }

  int StreamOf(int rank, bool gradient) const {
    return 2 * rank + (gradient ? 1 : 0);
  }

  std::optional<ScheduleViolation> CheckRendezvous() {
    // posted[message]: bit 1 once its send is posted, bit 2 once its receive
    // is; the pair completes when both are.
    std::vector<unsigned char> posted(send_position_.size(), 0);
    // Per stream: groups posted so far, unmatched ops in the newest one.
    std::vector<int> posted_groups(2 * p_, 0), pending(2 * p_, 0);
    std::vector<int> computed(p_, 0);
    auto completed = [&](int stream) {
      return posted_groups[stream] - (pending[stream] > 0 ? 1 : 0);
    };
    // A rank can only be unblocked by its own progress or by a peer matching
    // one of its posted ops, so a worklist of such ranks is exact.
    std::vector<int> work(p_);
    for (int r = 0; r < p_; ++r) work[r] = p_ - 1 - r;
    auto post_op = [&](int stream, int message, int peer, unsigned char mine) {
      unsigned char& bits = posted[message];
      bits |= mine;
      if (bits == 3) {
        if (--pending[StreamOf(peer, (stream & 1) != 0)] == 0) {
          work.push_back(peer);
        }
      } else {
        ++pending[stream];
      }
    };
    auto post = [&](int stream) {
      const Group& g = streams_[stream][posted_groups[stream]];
      if (g.send_message >= 0) post_op(stream, g.send_message, g.send_peer, 1);
      if (g.recv_message >= 0) post_op(stream, g.recv_message, g.recv_peer, 2);
      ++posted_groups[stream];
    };
    // Every entry runs its rank as far as it goes. Posting a group and
    // running an action only ever enable more of either, so the order in
    // which they are tried does not change where a rank stops: all ready
    // actions run, then all ready groups post, until neither moves.
    while (!work.empty()) {
      const int r = work.back();
      work.pop_back();
      const int n = static_cast<int>(s_.actions[r].size());
      const int* recv_code = recv_code_[r].data();
      for (bool moved = true; moved;) {
        moved = false;
        // A stream posts its next group once the previous one completed
        // (nothing of it is pending) and the tensor it sends (if any) has
        // been computed.
        for (int d = 0; d < 2; ++d) {
          const int stream = 2 * r + d;
          const std::vector<Group>& groups = streams_[stream];
          while (pending[stream] == 0 &&
                 posted_groups[stream] < static_cast<int>(groups.size()) &&
                 computed[r] > groups[posted_groups[stream]].send_action) {
            post(stream);
            moved = true;
          }
        }
        // An action runs once the group holding its receive completed.
        const int done[2] = {completed(2 * r), completed(2 * r + 1)};
        int i = computed[r];
        while (i < n && (recv_code[i] < 0 ||
                         done[recv_code[i] & 1] > recv_code[i] >> 1)) {
          ++i;
        }
        if (i != computed[r]) {
          computed[r] = i;
          moved = true;
        }
      }
    }
    for (int r = 0; r < p_; ++r) {
      const bool done =
          computed[r] == static_cast<int>(s_.actions[r].size()) &&
          completed(2 * r) == static_cast<int>(streams_[2 * r].size()) &&
          completed(2 * r + 1) == static_cast<int>(streams_[2 * r + 1].size());
      if (!done) return DescribeDeadlock(r, posted, posted_groups, computed);
    }
    return std::nullopt;
  }

  // Follows who-waits-for-whom from rank r until a rank repeats, so the
  // message names the whole cycle.
  ScheduleViolation DescribeDeadlock(int r,
                                     const std::vector<unsigned char>& posted,
                                     const std::vector<int>& posted_groups,
                                     const std::vector<int>& computed) const {
    auto describe_wait = [&](int rank, int* peer) -> std::string {
      for (int d = 0; d < 2; ++d) {
        const int stream = 2 * rank + d;
        if (posted_groups[stream] == 0) continue;
        const Group& g = streams_[stream][posted_groups[stream] - 1];
        // The group's send first, then its receive: the order they post in.
        const struct {
          int message, peer;
          bool is_send;
        } ops[] = {{g.send_message, g.send_peer, true},
                   {g.recv_message, g.recv_peer, false}};
        for (const auto& op : ops) {
          if (op.message < 0) continue;
          const unsigned char theirs = op.is_send ? 2 : 1;
          if (posted[op.message] & theirs) continue;
          *peer = op.peer;
          return absl::StrCat("rank ", rank, " waits to ",
                              op.is_send ? "send" : "receive",
                              d == 0 ? " an activation " : " a gradient ",
                              op.is_send ? "to" : "from", " rank ", op.peer);
        }
      }
      *peer = -1;
      return absl::StrCat("rank ", rank, " waits for a stream to drain");
    };
    std::vector<unsigned char> visited(p_, 0);
    std::string chain;
    for (int at = r; at >= 0 && !visited[at];) {
      visited[at] = 1;
      int peer = -1;
      absl::StrAppend(&chain, chain.empty() ? "" : "; ",
                      describe_wait(at, &peer));
      at = peer;
    }
    const int n = static_cast<int>(s_.actions[r].size());
    const int index = computed[r] < n ? computed[r] : n - 1;
    return At(r, index,
              absl::StrCat("deadlocks under rendezvous sends (a send completes "
                           "only when the peer posts the receive): ",
                           chain));
  }

  const Schedule& s_;
  const int p_, m_;
  int num_stages_ = 0;
  // The placement's rank of each stage: looked up once per action in every
  // pass, so computed once.
  std::vector<int> rank_of_;
  std::vector<unsigned char> fwd_, full_, input_, weight_;
  // send_position_[message]: its position among its channel's sends.
  std::vector<int> send_position_;
  // sender_[message]: the action that sends it (buffered sends only).
  std::vector<Endpoint> sender_;
  // One in-order stream per rank and direction: streams_[2r] carries
  // activations, streams_[2r+1] gradients. A group is one send paired with
  // the next receive on the same stream, or a lone receive.
  struct Group {
    int send_action = -1;   // The action whose output the group sends.
    int send_message = -1;  // -1: no send (a lone receive).
    int send_peer = -1;
    int recv_message = -1;  // -1: no receive (yet).
    int recv_peer = -1;
  };
  std::vector<std::vector<Group>> streams_;
  // recv_code_[r][i]: 2g + d where group g of rank r's stream d holds action
  // i's receive; -1 where the action receives nothing from another rank.
  std::vector<std::vector<int>> recv_code_;
  // sender_of_[r][i]: the action that sends action i's input ({-1, -1}:
  // none crosses ranks; buffered sends only).
  std::vector<std::vector<Endpoint>> sender_of_;
};

}  // namespace

std::string ToString(const ScheduleViolation& v) {
  if (v.rank < 0) return v.reason;
  if (v.index < 0) {
    return absl::StrCat("rank ", v.rank, ": ", ToString(v.action), " ",
                        v.reason);
  }
  return absl::StrCat("rank ", v.rank, ", action #", v.index, " (",
                      ToString(v.action), "): ", v.reason);
}

std::optional<ScheduleViolation> FindViolation(const Schedule& schedule) {
  return Validator(schedule).Run();
}

absl::Status ValidateSchedule(const Schedule& schedule) {
  if (auto v = FindViolation(schedule)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid schedule: ", ToString(*v)));
  }
  return absl::OkStatus();
}

}  // namespace conveyor::scheduler
