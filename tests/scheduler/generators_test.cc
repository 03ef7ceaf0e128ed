#include "scheduler/generators.h"

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/closed_form.h"
#include "scheduler/simulator.h"
#include "scheduler/validator.h"

namespace conveyor::scheduler {
namespace {

using ::testing::HasSubstr;

std::string Line(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.actions[rank]) {
    if (!out.empty()) out += ' ';
    out += ToString(a);
  }
  return out;
}

Schedule MustGenerate(ScheduleKind kind, int p, int m, int v = 1) {
  auto s = GenerateSchedule(
      kind, {.ranks = p, .microbatches = m, .virtual_stages = v});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Schedule{};
}

// Asserts sum(idle) / (P * makespan) == f exactly, by cross-multiplying.
void ExpectBubbleEquals(const SimulationResult<int64_t>& r, Fraction f,
                        const std::string& what) {
  int64_t idle = 0;
  for (int64_t x : r.idle) idle += x;
  const int64_t ranks = static_cast<int64_t>(r.idle.size());
  EXPECT_EQ(idle * f.denominator, f.numerator * ranks * r.makespan)
      << what << ": simulated " << r.bubble_fraction() << " vs closed form "
      << f.value();
}

// Property test: every generator, every P in 1..16, M in 1..64, V in 1..4.
// Where a generator accepts the options, the schedule must validate and its
// unit-cost simulation must match the closed form; where it refuses them,
// the refusal must be InvalidArgument.
TEST(GeneratorsPropertyTest, ValidAndMatchClosedForms) {
  int generated = 0;
  for (ScheduleKind kind : kAllScheduleKinds) {
    const bool split = SplitsBackward(kind);
    const auto costs = split ? SimulationCosts<int64_t>::UniformSplit(1, 1, 1)
                             : SimulationCosts<int64_t>::Uniform(1, 2);
    for (int p = 1; p <= 16; ++p) {
      for (int m = 1; m <= 64; ++m) {
        for (int v = 1; v <= 4; ++v) {
          const std::string what =
              std::string(ScheduleKindName(kind)) + " P=" + std::to_string(p) +
              " M=" + std::to_string(m) + " V=" + std::to_string(v);
          auto s = GenerateSchedule(
              kind, {.ranks = p, .microbatches = m, .virtual_stages = v});
          const bool supported =
              kind == ScheduleKind::kDualPipeV ? v == 2 && m >= 2 * p
              : kind == ScheduleKind::kZeroBubbleV
                  ? v == 2
                  : v == 1 || (TakesVirtualStages(kind) && m % p == 0);
          ASSERT_EQ(s.ok(), supported) << what << ": " << s.status();
          if (!s.ok()) {
            EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
                << what;
            continue;
          }
          ++generated;
          ASSERT_TRUE(ValidateSchedule(*s).ok())
              << what << ": " << ValidateSchedule(*s);
          if (kind != ScheduleKind::kDualPipeV) {
            EXPECT_EQ(s->TotalActions(),
                      static_cast<size_t>(p * v * m * (split ? 3 : 2)))
                << what;
          }
          auto r = Simulate(*s, costs);
          ASSERT_TRUE(r.ok()) << what << ": " << r.status();
          if (auto f = ClosedFormBubbleFraction(kind, p, m, v)) {
            ExpectBubbleEquals(*r, *f, what);
          }
          if (kind == ScheduleKind::k1F1B) {
            for (int rank = 0; rank < p; ++rank) {
              EXPECT_LE(r->peak_inflight[rank], p - rank) << what;
            }
          }
          if (kind == ScheduleKind::kInterleavedZeroBubble) {
            // Its busiest rank holds no more than interleaved-1f1b's (BWs
            // held back count as in flight), for a third of its bubble.
            auto base =
                Simulate(MustGenerate(ScheduleKind::kInterleaved1F1B, p, m, v),
                         SimulationCosts<int64_t>::Uniform(1, 2));
            ASSERT_TRUE(base.ok());
            EXPECT_LE(*std::max_element(r->peak_inflight.begin(),
                                        r->peak_inflight.end()),
                      *std::max_element(base->peak_inflight.begin(),
                                        base->peak_inflight.end()))
                << what;
          }
          if (kind == ScheduleKind::kEager1F1B) {
            // Exactly its warm-up: 2(P-r)-1 microbatches, or all M.
            for (int rank = 0; rank < p; ++rank) {
              EXPECT_EQ(r->peak_inflight[rank], std::min(2 * (p - rank) - 1, m))
                  << what << " rank " << rank;
            }
          }
          if (kind == ScheduleKind::kZeroBubbleH2) {
            // Rank r stashes its 2(P-r)-1 warm-up microbatches, or holds
            // them until their held-back BWs: 2P-1 on every rank, about
            // twice 1F1B's P.
            for (int rank = 0; rank < p; ++rank) {
              EXPECT_EQ(r->peak_inflight[rank], std::min(2 * p - 1, m))
                  << what << " rank " << rank;
            }
            // With M >= 2P-1, the synchronous floor M(F+BI+BW) + (P-1)F at
            // equal and unequal costs; with M >= P never above zb-h1's step
            // (below it, a unit or two longer in some cases).
            for (auto [f, bi, bw] : {std::array<int64_t, 3>{1, 1, 1},
                                     {4, 5, 3},
                                     {1, 2, 1},
                                     {2, 1, 3}}) {
              auto c = SimulationCosts<int64_t>::UniformSplit(f, bi, bw);
              auto h2 = Simulate(*s, c);
              auto h1 =
                  Simulate(MustGenerate(ScheduleKind::kZeroBubbleH1, p, m), c);
              ASSERT_TRUE(h2.ok() && h1.ok()) << what;
              if (m >= p) {
                EXPECT_LE(h2->makespan, h1->makespan) << what;
              }
              if (m >= 2 * p - 1) {
                EXPECT_EQ(h2->makespan, m * (f + bi + bw) + (p - 1) * f)
                    << what << " F=" << f << " BI=" << bi << " BW=" << bw;
              }
            }
          }
          if (PlacementOf(kind) == Placement::kV) {
            // Rank r holds stages r and 2P-1-r.
            for (int rank = 0; rank < p; ++rank) {
              for (const Action& a : s->actions[rank]) {
                ASSERT_TRUE(a.stage == rank || a.stage == 2 * p - 1 - rank)
                    << what << " " << ToString(a);
              }
            }
          }
          if (kind == ScheduleKind::kZeroBubbleV) {
            // At most 2P microbatch-stages: 1F1B's first-rank stash of P
            // whole stages.
            for (int rank = 0; rank < p; ++rank) {
              EXPECT_LE(r->peak_inflight[rank], 2 * p) << what;
            }
            // Over the same model (zb-h1's stages cost twice a zb-v stage),
            // never a longer step; with M >= 2P, half of zb-h1's bubble.
            auto h1 = Simulate(MustGenerate(ScheduleKind::kZeroBubbleH1, p, m),
                               SimulationCosts<int64_t>::UniformSplit(2, 2, 2));
            ASSERT_TRUE(h1.ok());
            EXPECT_LE(r->makespan, h1->makespan) << what;
            if (m >= 2 * p) {
              EXPECT_EQ(2 * (r->makespan - 6 * m), h1->makespan - 6 * m)
                  << what;
            }
          }
          if (kind == ScheduleKind::kDualPipeV) {
            // One stash more a rank than zb-v at most, and every stage's
            // weight gradients (B or BW) in ascending microbatch order, the
            // reference's accumulation order.
            for (int rank = 0; rank < p; ++rank) {
              EXPECT_LE(r->peak_inflight[rank], 2 * p + 1) << what;
              std::map<int, int> next;
              for (const Action& a : s->actions[rank]) {
                if (a.op == Op::kBackward || a.op == Op::kBackwardWeight) {
                  EXPECT_EQ(a.microbatch, next[a.stage]++)
                      << what << " " << ToString(a);
                }
              }
            }
          }
          if (kind == ScheduleKind::kLoopedBFS) {
            EXPECT_EQ(s->actions,
                      MustGenerate(ScheduleKind::kGPipe, p, m, v).actions)
                << what;
          }
          if (kind == ScheduleKind::kZeroBubbleH1) {
            auto base = Simulate(MustGenerate(ScheduleKind::k1F1B, p, m),
                                 SimulationCosts<int64_t>::Uniform(1, 2));
            ASSERT_TRUE(base.ok());
            if (p > 1) {
              EXPECT_LT(r->makespan, base->makespan) << what;
            }
            // Same activation stash as 1F1B: no rank holds more microbatches
            // than 1F1B's first rank does.
            const int stash_1f1b = base->peak_inflight[0];
            for (int rank = 0; rank < p; ++rank) {
              EXPECT_LE(r->peak_inflight[rank], stash_1f1b) << what;
            }
          }
        }
      }
    }
  }
  // V = 1 for every kind but zb-v and dualpipev, V = 2 for those (dualpipev
  // with M >= 2P: 65 - 2P values of M), plus V = 2..4 with P | M for the
  // four that take virtual stages in groups of P.
  int divisible = 0, dualpipev = 0;
  for (int p = 1; p <= 16; ++p) {
    divisible += 64 / p;
    dualpipev += 65 - 2 * p;
  }
  EXPECT_EQ(generated, (std::size(kAllScheduleKinds) - 1) * 16 * 64 +
                           dualpipev + 4 * 3 * divisible);
}

TEST(GeneratorsTest, InterleavedV1ReproducesJaxPPWarmup) {
  Schedule s = MustGenerate(ScheduleKind::kInterleaved1F1B, 4, 4, 1);
  EXPECT_EQ(Line(s, 2), "F2.0 F2.1 F2.2 B2.0 F2.3 B2.1 B2.2 B2.3");
  EXPECT_EQ(Line(s, 3), "F3.0 B3.0 F3.1 B3.1 F3.2 B3.2 F3.3 B3.3");
}

TEST(GeneratorsTest, InterleavedV2MatchesJaxPPVectors) {
  Schedule s = MustGenerate(ScheduleKind::kInterleaved1F1B, 4, 4, 2);
  EXPECT_EQ(Line(s, 0),
            "F0.0 F0.1 F0.2 F0.3 F4.0 F4.1 F4.2 F4.3 "
            "B4.0 B4.1 B4.2 B4.3 B0.0 B0.1 B0.2 B0.3");
  EXPECT_EQ(Line(s, 3),
            "F3.0 F3.1 F3.2 F3.3 F7.0 B7.0 F7.1 B7.1 F7.2 B7.2 F7.3 B7.3 "
            "B3.0 B3.1 B3.2 B3.3");
}

TEST(GeneratorsTest, OneFOneBWarmsUpWithPMinusRankMinusOneForwards) {
  Schedule s = MustGenerate(ScheduleKind::k1F1B, 4, 4);
  EXPECT_EQ(Line(s, 0), "F0.0 F0.1 F0.2 F0.3 B0.0 B0.1 B0.2 B0.3");
  EXPECT_EQ(Line(s, 2), "F2.0 F2.1 B2.0 F2.2 B2.1 F2.3 B2.2 B2.3");
  EXPECT_EQ(Line(s, 3), "F3.0 B3.0 F3.1 B3.1 F3.2 B3.2 F3.3 B3.3");
}

TEST(GeneratorsTest, GPipeRunsAllForwardsThenAllBackwards) {
  Schedule s = MustGenerate(ScheduleKind::kGPipe, 2, 3);
  EXPECT_EQ(Line(s, 1), "F1.0 F1.1 F1.2 B1.0 B1.1 B1.2");
}

// JaxPP's Eager1F1B(num_stages=4).tasks(8), its empty slots dropped: the
// same per-rank order.
TEST(GeneratorsTest, Eager1F1BMatchesJaxPPsOrder) {
  Schedule s = MustGenerate(ScheduleKind::kEager1F1B, 4, 8);
  EXPECT_EQ(Line(s, 0),
            "F0.0 F0.1 F0.2 F0.3 F0.4 F0.5 F0.6 B0.0 F0.7 B0.1 B0.2 B0.3 B0.4 "
            "B0.5 B0.6 B0.7");
  EXPECT_EQ(Line(s, 1),
            "F1.0 F1.1 F1.2 F1.3 F1.4 B1.0 F1.5 B1.1 F1.6 B1.2 F1.7 B1.3 B1.4 "
            "B1.5 B1.6 B1.7");
  EXPECT_EQ(Line(s, 2),
            "F2.0 F2.1 F2.2 B2.0 F2.3 B2.1 F2.4 B2.2 F2.5 B2.3 F2.6 B2.4 F2.7 "
            "B2.5 B2.6 B2.7");
  EXPECT_EQ(Line(s, 3),
            "F3.0 B3.0 F3.1 B3.1 F3.2 B3.2 F3.3 B3.3 F3.4 B3.4 F3.5 B3.5 F3.6 "
            "B3.6 F3.7 B3.7");
}

TEST(GeneratorsTest, ZeroBubbleH1HoldsBackRankWeightGradients) {
  Schedule s = MustGenerate(ScheduleKind::kZeroBubbleH1, 4, 8);
  // The last rank holds back 3 BWs and spends them while draining.
  EXPECT_EQ(Line(s, 3),
            "F3.0 BI3.0 F3.1 BI3.1 F3.2 BI3.2 F3.3 BI3.3 BW3.0 F3.4 BI3.4 "
            "BW3.1 F3.5 BI3.5 BW3.2 F3.6 BI3.6 BW3.3 F3.7 BI3.7 BW3.4 BW3.5 "
            "BW3.6 BW3.7");
  EXPECT_EQ(Line(s, 0),
            "F0.0 F0.1 F0.2 F0.3 BI0.0 BW0.0 F0.4 BI0.1 BW0.1 F0.5 BI0.2 "
            "BW0.2 F0.6 BI0.3 BW0.3 F0.7 BI0.4 BW0.4 BI0.5 BW0.5 BI0.6 BW0.6 "
            "BI0.7 BW0.7");
}

TEST(GeneratorsTest, ZeroBubbleH1MatchesThePaperBubbleAtUnitCosts) {
  // Bubble per rank (P-1)(F+BI-BW) = P-1 against 1F1B's 3(P-1).
  auto r = Simulate(MustGenerate(ScheduleKind::kZeroBubbleH1, 4, 8),
                    SimulationCosts<int64_t>::UniformSplit(1, 1, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->makespan, 3 * 8 + 3);
  for (int64_t idle : r->idle) EXPECT_EQ(idle, 3);
}

TEST(GeneratorsTest, ZeroBubbleVReproducesPyTorchsOrder) {
  // PyTorch's ScheduleZBVZeroBubble at P = 2, M = 4, worked by hand from its
  // phases: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
  Schedule s = MustGenerate(ScheduleKind::kZeroBubbleV, 2, 4, 2);
  EXPECT_EQ(s.placement, Placement::kV);
  EXPECT_EQ(Line(s, 0),
            "F0.0 F0.1 F0.2 F3.0 BI3.0 BW3.0 F3.1 BI3.1 BW3.1 F0.3 BI0.0 "
            "BW0.0 F3.2 BI3.2 BW3.2 BI0.1 BW0.1 F3.3 BI3.3 BW3.3 BI0.2 BW0.2 "
            "BI0.3 BW0.3");
  EXPECT_EQ(Line(s, 1),
            "F1.0 F2.0 F1.1 F2.1 BI2.0 BW2.0 F1.2 BI1.0 BW1.0 F2.2 BI2.1 "
            "BW2.1 F1.3 BI1.1 BW1.1 F2.3 BI2.2 BW2.2 BI1.2 BI2.3 BI1.3 BW1.2 "
            "BW2.3 BW1.3");
  // Its sends must be buffered: under rendezvous it deadlocks.
  EXPECT_FALSE(SendsRendezvous(ScheduleKind::kZeroBubbleV));
}

TEST(GeneratorsTest, DualPipeVReproducesPyTorchsOrder) {
  // PyTorch's ScheduleDualPipeV at P = 2, M = 4, worked by hand from its
  // eight steps; each OVERLAP_F_B is its F then its B.
  Schedule s = MustGenerate(ScheduleKind::kDualPipeV, 2, 4, 2);
  EXPECT_EQ(s.placement, Placement::kV);
  EXPECT_EQ(Line(s, 0),
            "F0.0 F0.1 F0.2 F3.0 BI3.0 BW3.0 F3.1 F0.3 B3.1 F3.2 B0.0 B3.2 "
            "F3.3 B0.1 B3.3 BI0.2 BW0.2 BI0.3 BW0.3");
  EXPECT_EQ(Line(s, 1),
            "F1.0 F2.0 F1.1 F2.1 F1.2 B2.0 F2.2 B1.0 F1.3 B2.1 F2.3 B1.1 B2.2 "
            "B1.2 BI2.3 BI1.3 BW2.3 BW1.3");
  EXPECT_FALSE(SendsRendezvous(ScheduleKind::kDualPipeV));
  auto few =
      GenerateSchedule(ScheduleKind::kDualPipeV,
                       {.ranks = 4, .microbatches = 7, .virtual_stages = 2});
  EXPECT_THAT(few.status().message(),
              HasSubstr("dualpipev needs at least as many microbatches as "
                        "stages, 2P = 8; got M = 7"));
}

TEST(GeneratorsTest, ZeroBubbleH2FillsTheWarmupWithForwards) {
  Schedule s = MustGenerate(ScheduleKind::kZeroBubbleH2, 4, 8);
  // Rank 0: 2(P-1) warm-up forwards, then F BI pairs; it holds back no BW.
  EXPECT_EQ(Line(s, 0),
            "F0.0 F0.1 F0.2 F0.3 F0.4 F0.5 F0.6 BI0.0 BW0.0 F0.7 BI0.1 "
            "BW0.1 BI0.2 BW0.2 BI0.3 BW0.3 BI0.4 BW0.4 BI0.5 BW0.5 BI0.6 "
            "BW0.6 BI0.7 BW0.7");
  // The last rank holds back 2(P-1) = 6 BWs until it drains.
  EXPECT_EQ(Line(s, 3),
            "F3.0 BI3.0 F3.1 BI3.1 F3.2 BI3.2 F3.3 BI3.3 F3.4 BI3.4 F3.5 "
            "BI3.5 F3.6 BI3.6 BW3.0 F3.7 BI3.7 BW3.1 BW3.2 BW3.3 BW3.4 BW3.5 "
            "BW3.6 BW3.7");
}

TEST(GeneratorsTest, RejectsOptionsWithTheFieldAndTheRule) {
  struct Case {
    ScheduleKind kind;
    ScheduleOptions options;
    const char* message;
  };
  const Case cases[] = {
      {ScheduleKind::k1F1B, {.ranks = 0, .microbatches = 4}, "ranks"},
      {ScheduleKind::k1F1B, {.ranks = 4, .microbatches = 0}, "microbatches"},
      {ScheduleKind::kGPipe,
       {.ranks = 4, .microbatches = 4, .virtual_stages = 0},
       "virtual stages"},
      {ScheduleKind::k1F1B,
       {.ranks = 4, .microbatches = 8, .virtual_stages = 2},
       "use interleaved-1f1b"},
      {ScheduleKind::kZeroBubbleH1,
       {.ranks = 4, .microbatches = 8, .virtual_stages = 2},
       "zb-h1 runs one stage per rank"},
      {ScheduleKind::kInterleaved1F1B,
       {.ranks = 4, .microbatches = 6, .virtual_stages = 2},
       "must be a multiple of ranks (P = 4)"},
      {ScheduleKind::kZeroBubbleV,
       {.ranks = 4, .microbatches = 8, .virtual_stages = 1},
       "zb-v holds two stages a rank (V = 2"},
      {ScheduleKind::kZeroBubbleV,
       {.ranks = 4, .microbatches = 8, .virtual_stages = 4},
       "got V = 4"},
      {ScheduleKind::k1F1B,
       {.ranks = 4096, .microbatches = 1 << 20},
       "too large"},
  };
  for (const Case& c : cases) {
    auto s = GenerateSchedule(c.kind, c.options);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
        << c.message;
    EXPECT_THAT(s.status().message(), HasSubstr(c.message));
  }
}

TEST(ClosedFormTest, KnownValuesAndWhereNoFormApplies) {
  auto f = ClosedFormBubbleFraction(ScheduleKind::k1F1B, 4, 8, 1);
  ASSERT_TRUE(f.has_value());
  EXPECT_DOUBLE_EQ(f->value(), 3.0 / 11.0);
  EXPECT_FALSE(
      ClosedFormBubbleFraction(ScheduleKind::kInterleaved1F1B, 4, 6, 2));
  EXPECT_FALSE(ClosedFormBubbleFraction(ScheduleKind::kZeroBubbleH1, 8, 4, 1));
}

}  // namespace
}  // namespace conveyor::scheduler
