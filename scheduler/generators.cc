#include "scheduler/generators.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::scheduler {
namespace {

absl::Status CheckOptions(ScheduleKind kind, const ScheduleOptions& o) {
  return CheckScheduleOptions(kind, o, /*forward_only=*/false);
}

}  // namespace

absl::Status CheckScheduleOptions(ScheduleKind kind, const ScheduleOptions& o,
                                  bool forward_only) {
  const absl::string_view name = ScheduleKindName(kind);
  if (o.ranks < 1 || o.ranks > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks (stages P) must be in 1..", kMaxRanks, ", got ", o.ranks));
  }
  if (o.microbatches < 1 || o.microbatches > kMaxMicrobatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatches (M) must be in 1..", kMaxMicrobatches,
                     ", got ", o.microbatches));
  }
  if (o.virtual_stages < 1 || o.virtual_stages > kMaxVirtualStages) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual stages (V) must be in 1..", kMaxVirtualStages,
                     ", got ", o.virtual_stages));
  }
  if (o.virtual_stages > 1 && !TakesVirtualStages(kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " runs one stage per rank (V = 1), got V = ", o.virtual_stages,
        "; use interleaved-1f1b, interleaved-zb, gpipe, looped-bfs, zb-v or "
        "dualpipev for virtual stages"));
  }
  if (kind == ScheduleKind::kDualPipeV && !forward_only &&
      o.microbatches < 2 * static_cast<int64_t>(o.ranks)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " needs at least as many microbatches as stages, 2P = ",
        2 * static_cast<int64_t>(o.ranks), "; got M = ", o.microbatches));
  }
  if ((kind == ScheduleKind::kZeroBubbleV ||
       kind == ScheduleKind::kDualPipeV) &&
      o.virtual_stages != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " holds two stages a rank (V = 2, placed in a V), got V = ",
        o.virtual_stages));
  }
  const int64_t cells =
      static_cast<int64_t>(o.ranks) * o.virtual_stages * o.microbatches;
  if (cells > kMaxStageMicrobatches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "P*V*M = ", cells, " stage-microbatches is too large (at most ",
        kMaxStageMicrobatches, ")"));
  }
  return absl::OkStatus();
}

Schedule EmptySchedule(ScheduleKind kind, const ScheduleOptions& o) {
  Schedule s;
  s.kind = kind;
  s.ranks = o.ranks;
  s.virtual_stages = o.virtual_stages;
  s.microbatches = o.microbatches;
  s.placement = PlacementOf(kind);
  s.actions.resize(o.ranks);
  return s;
}

namespace {

// The order in which a rank with V virtual stages visits (chunk, microbatch)
// pairs: microbatches in groups of P through chunk 0, then the same group
// through chunk 1, and so on (Megatron-LM's order). With V = 1 it is plain
// microbatch order. Rejects V > 1 with M % P != 0, where groups do not tile.
class GroupsOfP {
 public:
  static absl::StatusOr<GroupsOfP> Create(ScheduleKind kind,
                                          const ScheduleOptions& o) {
    if (o.virtual_stages > 1 && o.microbatches % o.ranks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          ScheduleKindName(kind),
          " with V > 1 takes microbatches in groups of P: microbatches (M = ",
          o.microbatches, ") must be a multiple of ranks (P = ", o.ranks, ")"));
    }
    return GroupsOfP(o.ranks, o.virtual_stages);
  }

  // Microbatch and chunk of the k-th visit, k in [0, M*V).
  int Microbatch(int k) const { return (k / (p_ * v_)) * p_ + k % p_; }
  int Chunk(int k) const { return (k / p_) % v_; }

 private:
  GroupsOfP(int p, int v) : p_(p), v_(v) {}
  int p_, v_;
};

// The 1F1B family with V = 1: rank r runs min(warmup(P, r), M) forwards,
// then alternates one backward and one forward while forwards remain, then
// runs the remaining backwards, every stage's in microbatch order.
absl::StatusOr<Schedule> WarmupThenAlternate(ScheduleKind kind,
                                             const ScheduleOptions& options,
                                             int (*warmup)(int p, int r)) {
  RETURN_IF_ERROR(CheckOptions(kind, options));
  Schedule s = EmptySchedule(kind, options);
  const int p = options.ranks, m = options.microbatches;
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    out.reserve(2 * m);
    const int first = std::min(warmup(p, r), m);
    int f = 0, b = 0;
    while (f < first) out.push_back({Op::kForward, r, f++});
    while (f < m) {
      out.push_back({Op::kBackward, r, b++});
      out.push_back({Op::kForward, r, f++});
    }
    while (b < m) out.push_back({Op::kBackward, r, b++});
  }
  return s;
}

// The split-backward 1F1B family with V = 1: rank r runs min(warmup(P, r),
// M) forwards, then pairs of one forward and one input-gradient backward
// (BI), then drains the BIs. A BI's weight gradient (BW) runs right after it
// once hold_back(P, r) BWs are waiting, and while draining; the rest run at
// the end.
absl::StatusOr<Schedule> WarmupThenSplitBackward(
    ScheduleKind kind, const ScheduleOptions& options,
    int (*warmup)(int p, int r), int (*hold_back)(int p, int r)) {
  RETURN_IF_ERROR(CheckOptions(kind, options));
  Schedule s = EmptySchedule(kind, options);
  const int p = options.ranks, m = options.microbatches;
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    out.reserve(3 * m);
    const int held = hold_back(p, r);
    std::deque<int> pending_weight;
    auto backward_input = [&](int j, bool draining) {
      out.push_back({Op::kBackwardInput, r, j});
      pending_weight.push_back(j);
      if (draining || static_cast<int>(pending_weight.size()) > held) {
        out.push_back({Op::kBackwardWeight, r, pending_weight.front()});
        pending_weight.pop_front();
      }
    };
    const int first = std::min(warmup(p, r), m);
    int f = 0, b = 0;
    while (f < first) out.push_back({Op::kForward, r, f++});
    while (f < m) {
      out.push_back({Op::kForward, r, f++});
      backward_input(b++, /*draining=*/f == m);
    }
    // Draining (every BI after the last forward): each BI is followed by one
    // held-back BW, which fills the wait for the next gradient from downstream.
    while (b < m) backward_input(b++, /*draining=*/true);
    for (int j : pending_weight) out.push_back({Op::kBackwardWeight, r, j});
  }
  return s;
}

// GPipe and looped-bfs: every forward, then every backward.
absl::StatusOr<Schedule> ChunkByChunk(ScheduleKind kind,
                                      const ScheduleOptions& options) {
  RETURN_IF_ERROR(CheckOptions(kind, options));
  // With V > 1, chunks are visited in groups of P microbatches. Pushing all
  // M through chunk 0 first would form a ring of blocked sends once M >= 2P:
  // the last rank's chunk-0 outputs wait for rank 0, which is still sending
  // chunk-0 work downstream.
  ASSIGN_OR_RETURN(GroupsOfP order, GroupsOfP::Create(kind, options));
  Schedule s = EmptySchedule(kind, options);
  const int p = options.ranks;
  const int total = options.microbatches * options.virtual_stages;
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    out.reserve(2 * total);
    for (int k = 0; k < total; ++k) {
      out.push_back(
          {Op::kForward, order.Chunk(k) * p + r, order.Microbatch(k)});
    }
    // Backwards visit the chunks last to first within each group of P
    // microbatches, microbatches ascending, as interleaved-1f1b does. Every
    // stage then accumulates its gradients over microbatches in ascending
    // order, as the in-process reference does, so results match it bit for
    // bit. (Reversed order has the same bubble but other float rounding,
    // which Adam amplifies on zero-gradient parameters such as attention's
    // key bias.)
    for (int k = 0; k < total; ++k) {
      const int chunk = options.virtual_stages - 1 - order.Chunk(k);
      out.push_back({Op::kBackward, chunk * p + r, order.Microbatch(k)});
    }
  }
  return s;
}

}  // namespace

bool TakesVirtualStages(ScheduleKind kind) {
  return kind == ScheduleKind::kGPipe ||
         kind == ScheduleKind::kInterleaved1F1B ||
         kind == ScheduleKind::kInterleavedZeroBubble ||
         kind == ScheduleKind::kLoopedBFS ||
         kind == ScheduleKind::kZeroBubbleV || kind == ScheduleKind::kDualPipeV;
}

absl::StatusOr<Schedule> GenerateSchedule(ScheduleKind kind,
                                          const ScheduleOptions& options) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return GenerateGPipe(options);
    case ScheduleKind::k1F1B:
      return Generate1F1B(options);
    case ScheduleKind::kInterleaved1F1B:
      return GenerateInterleaved1F1B(options);
    case ScheduleKind::kZeroBubbleH1:
      return GenerateZeroBubbleH1(options);
    case ScheduleKind::kEager1F1B:
      return GenerateEager1F1B(options);
    case ScheduleKind::kInterleavedZeroBubble:
      return GenerateInterleavedZeroBubble(options);
    case ScheduleKind::kZeroBubbleH2:
      return GenerateZeroBubbleH2(options);
    case ScheduleKind::kZeroBubbleV:
      return GenerateZeroBubbleV(options);
    case ScheduleKind::kLoopedBFS:
      return GenerateLoopedBFS(options);
    case ScheduleKind::kDualPipeV:
      return GenerateDualPipeV(options);
  }
  return absl::InvalidArgumentError("unknown schedule kind");
}

absl::StatusOr<Schedule> GenerateGPipe(const ScheduleOptions& options) {
  return ChunkByChunk(ScheduleKind::kGPipe, options);
}

absl::StatusOr<Schedule> GenerateLoopedBFS(const ScheduleOptions& options) {
  return ChunkByChunk(ScheduleKind::kLoopedBFS, options);
}

absl::StatusOr<Schedule> Generate1F1B(const ScheduleOptions& options) {
  // F, B pairs after P-r-1 warm-up forwards are P-r forwards, then B, F
  // pairs.
  return WarmupThenAlternate(ScheduleKind::k1F1B, options,
                             [](int p, int r) { return p - r; });
}

absl::StatusOr<Schedule> GenerateEager1F1B(const ScheduleOptions& options) {
  return WarmupThenAlternate(ScheduleKind::kEager1F1B, options,
                             [](int p, int r) { return 2 * (p - r) - 1; });
}

absl::StatusOr<Schedule> GenerateInterleaved1F1B(
    const ScheduleOptions& options) {
  RETURN_IF_ERROR(CheckOptions(ScheduleKind::kInterleaved1F1B, options));
  ASSIGN_OR_RETURN(GroupsOfP order,
                   GroupsOfP::Create(ScheduleKind::kInterleaved1F1B, options));
  Schedule s = EmptySchedule(ScheduleKind::kInterleaved1F1B, options);
  const int p = options.ranks, v = options.virtual_stages;
  const int total = options.microbatches * v;
  // Backwards visit the chunks in reverse.
  auto backward_chunk = [&](int k) { return v - 1 - order.Chunk(k); };
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    out.reserve(2 * total);
    const int warmup = std::min(2 * (p - r - 1) + (v - 1) * p, total);
    auto push_f = [&](int k) {
      out.push_back(
          {Op::kForward, order.Chunk(k) * p + r, order.Microbatch(k)});
    };
    auto push_b = [&](int k) {
      out.push_back(
          {Op::kBackward, backward_chunk(k) * p + r, order.Microbatch(k)});
    };
    for (int k = 0; k < warmup; ++k) push_f(k);
    for (int i = 0; i < total - warmup; ++i) {
      push_f(warmup + i);
      push_b(i);
    }
    for (int i = total - warmup; i < total; ++i) push_b(i);
  }
  return s;
}

absl::StatusOr<Schedule> GenerateZeroBubbleH1(const ScheduleOptions& options) {
  // Rank r starts r forward-times after rank 0; holding back r weight
  // gradients lets it run the input-gradient chain (the critical path
  // upstream) first and spend the held-back BWs where 1F1B would idle.
  return WarmupThenSplitBackward(
      ScheduleKind::kZeroBubbleH1, options,
      [](int p, int r) { return p - r - 1; }, [](int, int r) { return r; });
}

absl::StatusOr<Schedule> GenerateZeroBubbleH2(const ScheduleOptions& options) {
  // Rank r's first input gradient arrives 2(P-r)-1 forward-times after its
  // first forward: that many forwards fill the wait. Holding back 2r weight
  // gradients (twice zb-h1's) keeps the input-gradient chain upstream free
  // of them until the drain.
  return WarmupThenSplitBackward(
      ScheduleKind::kZeroBubbleH2, options,
      [](int p, int r) { return 2 * (p - r - 1); },
      [](int, int r) { return 2 * r; });
}

absl::StatusOr<Schedule> GenerateInterleavedZeroBubble(
    const ScheduleOptions& options) {
  constexpr ScheduleKind kKind = ScheduleKind::kInterleavedZeroBubble;
  RETURN_IF_ERROR(CheckOptions(kKind, options));
  const int p = options.ranks, m = options.microbatches,
            v = options.virtual_stages;
  // Chunk by chunk in groups of P, as interleaved-1f1b: PyTorch's rounds of
  // M / max(1, M / P) microbatches deadlock under rendezvous sends when the
  // round is not a multiple of P (P = 3, M = 5, V = 2: a ring of three
  // ranks each waiting to send), since it relies on sends that never block.
  RETURN_IF_ERROR(GroupsOfP::Create(kKind, options).status());
  const int per_round = options.virtual_stages > 1 ? p : m;
  const int total = m * v;
  Schedule s = EmptySchedule(kKind, options);
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    out.reserve(3 * total);
    // PyTorch's warm-up, (V-1)P + (P-1-r), deadlocks under rendezvous sends
    // with V > 1 (P = 4, M = 8, V = 2: rank 0's gradient to rank 3 waits on
    // rank 3's activation to rank 0, and the reverse); twice the per-rank
    // term, as interleaved-1f1b has, runs and keeps the (P-1)/(3MV+P-1)
    // bubble.
    const int stagger = (v > 1 ? 2 : 1) * (p - 1 - r);
    const int warmup = std::min((v - 1) * per_round + stagger, total);
    auto forward_stage = [&](int op) { return ((op / per_round) % v) * p + r; };
    auto backward_stage = [&](int op) {
      return (v - 1 - ((op - warmup) / per_round) % v) * p + r;
    };
    // Each chunk's microbatches in order, for F and for BI.
    std::vector<int> next_forward(v, 0), next_backward(v, 0);
    std::deque<Action> pending_weight;
    auto forward = [&](int op) {
      const int stage = forward_stage(op);
      out.push_back({Op::kForward, stage, next_forward[stage / p]++});
    };
    auto backward = [&](int op) {
      const int stage = backward_stage(op);
      const int mb = next_backward[stage / p]++;
      out.push_back({Op::kBackwardInput, stage, mb});
      pending_weight.push_back({Op::kBackwardWeight, stage, mb});
      if (op - warmup >= r) {
        out.push_back(pending_weight.front());
        pending_weight.pop_front();
      }
    };
    for (int op = 0; op < warmup; ++op) forward(op);
    for (int op = warmup; op < total; ++op) {
      forward(op);
      backward(op);
    }
    for (int op = total; op < total + warmup; ++op) backward(op);
    for (const Action& a : pending_weight) out.push_back(a);
  }
  return s;
}

absl::StatusOr<Schedule> GenerateZeroBubbleV(const ScheduleOptions& options) {
  constexpr ScheduleKind kKind = ScheduleKind::kZeroBubbleV;
  RETURN_IF_ERROR(CheckOptions(kKind, options));
  const int p = options.ranks, m = options.microbatches;
  // The order is laid out for at least 2P-1 microbatches, which keeps every
  // phase's count non-negative, and the surplus microbatches are dropped.
  const int n = std::max(m, 2 * p - 1);
  Schedule s = EmptySchedule(kKind, options);
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    out.reserve(6 * m);
    // Chunk 0 runs down the ranks (stage r), chunk 1 back up (stage 2P-1-r).
    const int stage[2] = {r, 2 * p - 1 - r};
    int next_f[2] = {0, 0}, next_bi[2] = {0, 0}, next_bw[2] = {0, 0};
    auto push = [&](Op op, int chunk, int* next) {
      const int mb = next[chunk]++;
      if (mb < m) out.push_back({op, stage[chunk], mb});
    };
    auto f = [&](int chunk) { push(Op::kForward, chunk, next_f); };
    auto bi = [&](int chunk) { push(Op::kBackwardInput, chunk, next_bi); };
    auto bw = [&](int chunk) { push(Op::kBackwardWeight, chunk, next_bw); };
    // Warm-up: chunk-0 forwards until the first chunk-1 input can have come
    // back up, then chunk 1 joins, then chunk 1's first backwards.
    for (int i = 0; i < 2 * (p - r) - 1; ++i) f(0);
    for (int i = 0; i < r; ++i) {
      f(1);
      f(0);
    }
    for (int i = 0; i < p - r; ++i) {
      f(1);
      bi(1);
      bw(1);
    }
    // Steady: each chunk a forward, an input gradient and its weight
    // gradient in turn.
    while (next_f[1] < next_f[0] || next_f[0] < n) {
      if (next_f[0] < n) f(0);
      bi(0);
      bw(0);
      f(1);
      bi(1);
      bw(1);
    }
    // Cool-down: the input-gradient chain first (it is the critical path
    // upstream), weight gradients where the rank would otherwise wait.
    for (int i = 0; i < r; ++i) {
      bi(0);
      bi(1);
    }
    for (int i = 0; i < p - r; ++i) {
      bi(0);
      bw(0);
    }
    while (next_bw[1] < next_bi[1]) bw(1);
    while (next_bw[0] < next_bi[0]) bw(0);
  }
  return s;
}

absl::StatusOr<Schedule> GenerateDualPipeV(const ScheduleOptions& options) {
  constexpr ScheduleKind kKind = ScheduleKind::kDualPipeV;
  RETURN_IF_ERROR(CheckOptions(kKind, options));
  const int p = options.ranks, m = options.microbatches;
  Schedule s = EmptySchedule(kKind, options);
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    out.reserve(6 * m);
    const int stage[2] = {r, 2 * p - 1 - r};
    int next_f[2] = {0, 0}, next_b[2] = {0, 0};
    std::deque<Action> pending_weight;
    auto f = [&](int chunk) {
      out.push_back({Op::kForward, stage[chunk], next_f[chunk]++});
    };
    // A backward, whole (B) or split (BI now, its BW queued).
    auto b = [&](int chunk, bool split) {
      const int mb = next_b[chunk]++;
      if (!split) {
        out.push_back({Op::kBackward, stage[chunk], mb});
        return;
      }
      out.push_back({Op::kBackwardInput, stage[chunk], mb});
      pending_weight.push_back({Op::kBackwardWeight, stage[chunk], mb});
    };
    auto w = [&] {
      if (pending_weight.empty()) return;
      out.push_back(pending_weight.front());
      pending_weight.pop_front();
    };
    // 1. Chunk-0 forwards until chunk 1's first input can come back.
    for (int i = 0; i < 2 * (p - r - 1); ++i) f(0);
    // 2. Both chunks' forwards.
    for (int i = 0; i <= r; ++i) {
      f(0);
      f(1);
    }
    // 3. Chunk 1 zero-bubble style: BI, a held BW, the next forward.
    for (int i = 0; i < p - r - 1; ++i) {
      b(1, true);
      w();
      f(1);
    }
    // 4. The main phase: a forward of one chunk paired with a backward of
    //    the other (DualPipe overlaps each pair; this executor runs the two
    //    in turn, and the simulator models them so).
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {
      f(0);
      b(1, false);
      f(1);
      b(0, false);
    }
    // 5. Chunk 1's last backwards, each with a chunk-1 forward and a chunk-0
    //    backward.
    for (int i = 0; i < p - r - 1; ++i) {
      b(1, false);
      f(1);
      b(0, false);
    }
    // 6. Both chunks' backwards, split from the middle on (odd ranks split
    //    chunk 1's first), so the held BWs fill the drain.
    bool split = false;
    for (int i = 0; i <= r; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      b(1, split);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      b(0, split);
    }
    // 7. Chunk 0's last backwards, each after a held BW; 8. the rest.
    for (int i = 0; i < p - r - 1; ++i) {
      w();
      b(0, split);
    }
    while (!pending_weight.empty()) w();
  }
  return s;
}

}  // namespace conveyor::scheduler
