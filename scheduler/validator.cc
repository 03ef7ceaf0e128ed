#include "scheduler/validator.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
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

// One send or receive in a communication group.
struct CommOp {
  int peer = 0;
  int channel = 0;  // See Validator::Channel.
  int seq = 0;      // Position in the channel's message sequence.
  bool is_send = false;
};

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

  // The message action `a` on rank r sends after it runs, if any.
  std::optional<std::pair<int, Message>> SendOf(const Action& a, int r) const {
    if (a.op == Op::kForward && a.stage + 1 < num_stages_ &&
        Rank(a.stage + 1) != r) {
      return std::make_pair(Rank(a.stage + 1),
                            Message{false, a.stage, a.microbatch});
    }
    if (ProducesInputGradient(a.op) && a.stage > 0 && Rank(a.stage - 1) != r) {
      return std::make_pair(Rank(a.stage - 1),
                            Message{true, a.stage, a.microbatch});
    }
    return std::nullopt;
  }

  // The message action `a` on rank r must receive before it runs, if any.
  std::optional<std::pair<int, Message>> RecvOf(const Action& a, int r) const {
    if (a.op == Op::kForward && a.stage > 0 && Rank(a.stage - 1) != r) {
      return std::make_pair(Rank(a.stage - 1),
                            Message{false, a.stage - 1, a.microbatch});
    }
    if (ProducesInputGradient(a.op) && a.stage + 1 < num_stages_ &&
        Rank(a.stage + 1) != r) {
      return std::make_pair(Rank(a.stage + 1),
                            Message{true, a.stage + 1, a.microbatch});
    }
    return std::nullopt;
  }

  // One in-order channel per sender, receiver and direction, matching the
  // two streams of the executor model: activations and gradients never share
  // an order, even with P = 2 where both go to the same peer. Every
  // placement sends only to the next or the previous rank (mod P), so a
  // sender has at most four channels.
  int Channel(int from, int to, const Message& m) const {
    const int side = to == (from + 1) % p_ ? 0 : 1;
    return 4 * from + 2 * side + (m.gradient ? 1 : 0);
  }

  // Builds the streams (see the header) and checks that, on every channel,
  // the k-th tensor sent is the k-th tensor expected.
  std::optional<ScheduleViolation> CheckMessageOrder() {
    struct Sequences {
      std::vector<std::pair<Message, Endpoint>> sent, expected;
    };
    std::vector<Sequences> channels(4 * p_);
    streams_.assign(2 * p_, {});
    recv_group_.assign(p_, {});
    for (int r = 0; r < p_; ++r) {
      const auto& program = s_.actions[r];
      const int n = static_cast<int>(program.size());
      recv_group_[r].assign(n, -1);
      // A stream holds at most one group per activation (or gradient) the
      // rank sends or receives: about half its actions each.
      streams_[2 * r].reserve(n / 2 + 1);
      streams_[2 * r + 1].reserve(n / 2 + 1);
      // Whether the newest group on each stream is a send still waiting for
      // the next receive to pair with.
      bool open[2] = {false, false};
      for (int i = 0; i < n; ++i) {
        if (auto recv = RecvOf(program[i], r)) {
          const int d = recv->second.gradient ? 1 : 0;
          const int channel = Channel(recv->first, r, recv->second);
          auto& seq = channels[channel].expected;
          auto& stream = streams_[2 * r + d];
          if (!open[d]) stream.push_back({});
          open[d] = false;
          stream.back().Add(
              {recv->first, channel, static_cast<int>(seq.size()), false});
          recv_group_[r][i] = static_cast<int>(stream.size()) - 1;
          seq.push_back({recv->second, {r, i}});
        }
        if (auto send = SendOf(program[i], r)) {
          const int d = send->second.gradient ? 1 : 0;
          const int channel = Channel(r, send->first, send->second);
          auto& seq = channels[channel].sent;
          auto& stream = streams_[2 * r + d];
          stream.push_back({});
          stream.back().send_action = i;
          open[d] = true;
          stream.back().Add(
              {send->first, channel, static_cast<int>(seq.size()), true});
          seq.push_back({send->second, {r, i}});
        }
      }
    }
    // Each receive's sender, for the buffered-send check (meaningful only
    // where the sequences match, which is all that check sees).
    sender_of_.clear();
    if (!SendsRendezvous(s_.kind)) {
      sender_of_.resize(p_);
      for (int r = 0; r < p_; ++r) {
        sender_of_[r].assign(s_.actions[r].size(), Endpoint{-1, -1});
      }
      for (const Sequences& seq : channels) {
        for (size_t k = 0; k < seq.expected.size() && k < seq.sent.size();
             ++k) {
          const Endpoint& e = seq.expected[k].second;
          sender_of_[e.rank][e.index] = seq.sent[k].second;
        }
      }
    }
    // Report the mismatch whose receiving action comes first (by rank, then
    // position), so the answer does not depend on channel numbering.
    std::optional<ScheduleViolation> first;
    for (int channel = 0; channel < 4 * p_; ++channel) {
      const Sequences& seq = channels[channel];
      const int from = channel / 4;
      for (size_t k = 0; k < seq.expected.size(); ++k) {
        // Completeness guarantees equal lengths; a mismatch is an ordering
        // problem.
        if (k < seq.sent.size() && seq.sent[k].first == seq.expected[k].first) {
          continue;
        }
        const Endpoint& e = seq.expected[k].second;
        if (first && (first->rank < e.rank ||
                      (first->rank == e.rank && first->index < e.index))) {
          break;
        }
        first = At(e.rank, e.index,
                   absl::StrCat(
                       "its input is message #", k, " from rank ", from,
                       ", expected to be the ", Describe(seq.expected[k].first),
                       ", but rank ", from, " sends the ",
                       k < seq.sent.size() ? Describe(seq.sent[k].first)
                                           : std::string("nothing"),
                       " at that position; in-order transports (NCCL) would "
                       "deliver the wrong tensor"));
        break;
      }
    }
    return first;
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
    // posted[channel][k]: bit 1 once the k-th send is posted, bit 2 once the
    // k-th receive is; the pair completes when both are.
    std::vector<std::vector<unsigned char>> posted(4 * p_);
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
    auto post = [&](int stream) {
      const bool gradient = stream & 1;
      for (const CommOp& op : streams_[stream][posted_groups[stream]].ops()) {
        auto& bits = posted[op.channel];
        if (bits.size() <= static_cast<size_t>(op.seq))
          bits.resize(op.seq + 1, 0);
        const unsigned char mine = op.is_send ? 1 : 2, theirs = 3 - mine;
        bits[op.seq] |= mine;
        if (bits[op.seq] & theirs) {
          if (--pending[StreamOf(op.peer, gradient)] == 0) {
            work.push_back(op.peer);
          }
        } else {
          ++pending[stream];
        }
      }
      ++posted_groups[stream];
    };
    // Every entry runs its rank as far as it goes.
    while (!work.empty()) {
      const int r = work.back();
      work.pop_back();
      const int n = static_cast<int>(s_.actions[r].size());
      for (bool moved = true; moved;) {
        moved = false;
        // A stream posts its next group once the previous one completed and
        // the tensor it sends (if any) has been computed.
        for (int d = 0; d < 2; ++d) {
          const int stream = 2 * r + d;
          const int g = posted_groups[stream];
          if (g < static_cast<int>(streams_[stream].size()) &&
              completed(stream) == g &&
              computed[r] > streams_[stream][g].send_action) {
            post(stream);
            moved = true;
          }
        }
        // An action runs once the group holding its receive completed.
        if (computed[r] < n) {
          const int i = computed[r];
          const int stream = StreamOf(r, s_.actions[r][i].op != Op::kForward);
          if (recv_group_[r][i] < 0 || completed(stream) > recv_group_[r][i]) {
            ++computed[r];
            moved = true;
          }
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
  ScheduleViolation DescribeDeadlock(
      int r, const std::vector<std::vector<unsigned char>>& posted,
      const std::vector<int>& posted_groups,
      const std::vector<int>& computed) const {
    auto describe_wait = [&](int rank, int* peer) -> std::string {
      for (int d = 0; d < 2; ++d) {
        const int stream = 2 * rank + d;
        if (posted_groups[stream] == 0) continue;
        for (const CommOp& op :
             streams_[stream][posted_groups[stream] - 1].ops()) {
          const auto& bits = posted[op.channel];
          const unsigned char theirs = op.is_send ? 2 : 1;
          if (static_cast<size_t>(op.seq) < bits.size() &&
              (bits[op.seq] & theirs)) {
            continue;
          }
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
  // One in-order stream per rank and direction: streams_[2r] carries
  // activations, streams_[2r+1] gradients. A group is one send paired with
  // the next receive on the same stream, or a lone receive.
  struct Group {
    // At most one send and one receive.
    std::array<CommOp, 2> op_storage;
    int num_ops = 0;
    int send_action = -1;  // The action whose output the group sends.
    void Add(const CommOp& op) { op_storage[num_ops++] = op; }
    std::span<const CommOp> ops() const {
      return {op_storage.data(), static_cast<size_t>(num_ops)};
    }
  };
  std::vector<std::vector<Group>> streams_;
  // recv_group_[r][i]: the group on action i's stream that holds its receive.
  std::vector<std::vector<int>> recv_group_;
  // sender_of_[r][i]: the action that sends action i's input ({-1, -1}:
  // none crosses ranks).
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
