#include "scheduler/stage_search.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "scheduler/generators.h"
#include "scheduler/internal/stage_splits.h"
#include "scheduler/partitioner.h"
#include "scheduler/simulator.h"

namespace conveyor::scheduler {
namespace {

using stage_search_internal::PrefixSums;
using stage_search_internal::SeedSplit;
using stage_search_internal::SplitEnumerator;
using stage_search_internal::UniformSplit;

// Makespans within this relative distance of the best count as ties.
constexpr double kTieTolerance = 1e-12;
// Local search stops after this many sweeps even if a move still helps.
constexpr int kMaxSweeps = 100;

// Whole bytes, in full ("1073741824", not "1.07374e+09").
std::string Bytes(double value) {
  char buf[400];  // fixed notation of any double fits
  const auto [end, ec] =
      std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed, 0);
  CONVEYOR_CHECK(ec == std::errc(), "400 bytes hold any double in fixed");
  return std::string(buf, end);
}

// Shortest text that reads back as the same double, for error messages.
std::string Num(double value) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  CONVEYOR_CHECK(ec == std::errc(), "32 bytes hold any double");
  return std::string(buf, end);
}

// `value` is no worse than `best` within the tie tolerance.
bool WithinTolerance(double value, double best) {
  return value <= best + kTieTolerance * std::abs(best);
}

absl::Status CheckLayers(const std::vector<LayerCosts>& layers) {
  if (layers.empty()) {
    return absl::InvalidArgumentError(
        "layers must have one entry per layer, got none");
  }
  if (layers.size() > static_cast<size_t>(kMaxPartitionLayers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers has ", layers.size(), " entries; at most ",
                     kMaxPartitionLayers, " are supported"));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCosts& c = layers[i];
    const std::pair<absl::string_view, double> fields[] = {
        {"forward", c.forward},
        {"backward_input", c.backward_input},
        {"backward_weight", c.backward_weight},
        {"activation_bytes", c.activation_bytes},
        {"state_bytes", c.state_bytes},
    };
    for (const auto& [name, value] : fields) {
      if (!std::isfinite(value) || value < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("layers[", i, "].", name,
                         " must be finite and >= 0, got ", Num(value)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFixedBoundaries(const std::vector<int>& fixed, int layers,
                                  int stages) {
  if (fixed.size() > static_cast<size_t>(stages - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fixed_boundaries has ", fixed.size(), " entries; at most S - 1 = ",
        stages - 1, " fit into ", stages, " stages"));
  }
  for (size_t i = 0; i < fixed.size(); ++i) {
    if (fixed[i] < 1 || fixed[i] > layers - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fixed_boundaries[", i, "] = ", fixed[i], " must be in 1..L-1 = 1..",
          layers - 1, " (the first layer of a stage other than the first)"));
    }
    if (i > 0 && fixed[i] <= fixed[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fixed_boundaries must be strictly ascending, but fixed_boundaries[",
          i, "] = ", fixed[i], " follows ", fixed[i - 1]));
    }
  }
  return absl::OkStatus();
}

// Validates everything but the schedule shape (GenerateSchedule's job) and
// returns the schedule.
absl::StatusOr<Schedule> CheckInputAndGenerate(const StageSearchInput& in) {
  RETURN_IF_ERROR(CheckLayers(in.layers));
  ASSIGN_OR_RETURN(
      Schedule schedule,
      GenerateSchedule(in.kind, {.ranks = in.ranks,
                                 .microbatches = in.microbatches,
                                 .virtual_stages = in.virtual_stages}));
  const int layers = static_cast<int>(in.layers.size());
  const int stages = schedule.num_stages();
  if (stages > kMaxPartitionStages) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks * virtual_stages = ", stages, " stages; at most ",
                     kMaxPartitionStages, " are supported"));
  }
  if (stages > layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layers has ", layers, " entries but ranks * virtual_stages = ", stages,
        " stages: every stage needs at least one layer"));
  }
  // Totals bound every stage sum. A rank holds at most M * V microbatches'
  // stashes (V stages, M each), which bounds every rank's memory.
  long double time = 0, activation = 0, state = 0;
  for (const LayerCosts& c : in.layers) {
    time += static_cast<long double>(c.forward) + c.backward_input +
            c.backward_weight;
    activation += c.activation_bytes;
    state += c.state_bytes;
  }
  if (!std::isfinite(static_cast<double>(time))) {
    return absl::InvalidArgumentError(
        "layers: the sum of forward + backward_input + backward_weight over "
        "all layers overflows a double");
  }
  const long double memory_bound =
      state + activation * static_cast<long double>(in.microbatches) *
                  in.virtual_stages;
  if (!std::isfinite(static_cast<double>(memory_bound))) {
    return absl::InvalidArgumentError(
        "layers: state_bytes + activation_bytes * microbatches * "
        "virtual_stages summed over all layers overflows a double");
  }
  if (!std::isfinite(in.latency) || in.latency < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("latency must be finite and >= 0, got ", Num(in.latency)));
  }
  RETURN_IF_ERROR(CheckFixedBoundaries(in.fixed_boundaries, layers, stages));
  if (in.memory_budget.has_value() &&
      (!std::isfinite(*in.memory_budget) || *in.memory_budget < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_budget must be finite and >= 0 (bytes), got ",
                     Num(*in.memory_budget)));
  }
  if (in.exhaustive_limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exhaustive_limit must be >= 0, got ", in.exhaustive_limit));
  }
  if (in.max_simulated_actions < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_simulated_actions must be >= 1, got ", in.max_simulated_actions));
  }
  return schedule;
}

absl::Status CheckSplit(const std::vector<int>& stage_begin, int layers,
                        int stages) {
  if (stage_begin.size() != static_cast<size_t>(stages)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage_begin must have one entry per stage (", stages,
                     "), got ", stage_begin.size()));
  }
  if (stage_begin[0] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage_begin[0] must be 0 (the first stage starts at layer 0), got ",
        stage_begin[0]));
  }
  for (int s = 1; s < stages; ++s) {
    if (stage_begin[s] <= stage_begin[s - 1] || stage_begin[s] >= layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage_begin must be strictly increasing and below L = ", layers,
          " (every stage holds a layer), but stage_begin[", s,
          "] = ", stage_begin[s], " follows ", stage_begin[s - 1]));
    }
  }
  return absl::OkStatus();
}

// What one split predicts.
struct Evaluation {
  double makespan = 0;
  double bubble_fraction = 0;
  std::vector<double> stage_time;
  std::vector<double> stage_memory;
  std::vector<double> rank_memory;
  double peak_memory = 0;  // the largest rank_memory
};

// Scores splits of one input with one schedule.
class Evaluator {
 public:
  Evaluator(const StageSearchInput& in, Schedule schedule)
      : in_(in), schedule_(std::move(schedule)) {
    std::vector<double> f, bi, bw, act, state;
    for (const LayerCosts& c : in.layers) {
      f.push_back(c.forward);
      bi.push_back(c.backward_input);
      bw.push_back(c.backward_weight);
      act.push_back(c.activation_bytes);
      state.push_back(c.state_bytes);
    }
    forward_ = PrefixSums(f);
    backward_input_ = PrefixSums(bi);
    backward_weight_ = PrefixSums(bw);
    activation_ = PrefixSums(act);
    state_ = PrefixSums(state);
  }

  int layers() const { return static_cast<int>(in_.layers.size()); }
  // How many splits max_simulated_actions allows simulating (at least 1).
  int64_t SimulationBudget() const {
    const int64_t actions =
        std::max<int64_t>(1, static_cast<int64_t>(schedule_.TotalActions()));
    return std::max<int64_t>(1, in_.max_simulated_actions / actions);
  }
  int stages() const { return schedule_.num_stages(); }
  int ranks() const { return schedule_.ranks; }

  // `stage_begin` must be a valid split (CheckSplit).
  absl::StatusOr<Evaluation> Evaluate(
      const std::vector<int>& stage_begin) const {
    const int stages = this->stages();
    SimulationCosts<double> costs;
    costs.forward.resize(stages);
    costs.backward_input.resize(stages);
    costs.backward_weight.resize(stages);
    costs.latency = in_.latency;  // `backward` stays empty: B = BI + BW.
    for (int s = 0; s < stages; ++s) {
      const int begin = stage_begin[s];
      const int end = s + 1 < stages ? stage_begin[s + 1] : layers();
      costs.forward[s] = Sum(forward_, begin, end);
      costs.backward_input[s] = Sum(backward_input_, begin, end);
      costs.backward_weight[s] = Sum(backward_weight_, begin, end);
    }
    ASSIGN_OR_RETURN(SimulationResult<double> sim, Simulate(schedule_, costs));
    Evaluation e;
    e.makespan = sim.makespan;
    e.bubble_fraction = sim.bubble_fraction();
    e.rank_memory.assign(ranks(), 0);
    for (int s = 0; s < stages; ++s) {
      const int begin = stage_begin[s];
      const int end = s + 1 < stages ? stage_begin[s + 1] : layers();
      const int rank = schedule_.RankOfStage(s);
      e.stage_time.push_back(costs.forward[s] + costs.backward_input[s] +
                             costs.backward_weight[s]);
      e.stage_memory.push_back(Sum(state_, begin, end) +
                               Sum(activation_, begin, end) *
                                   sim.peak_inflight[rank]);
      e.rank_memory[rank] += e.stage_memory.back();
    }
    e.peak_memory =
        *std::max_element(e.rank_memory.begin(), e.rank_memory.end());
    return e;
  }

  // How far `e` is over the budget (0 when within it or unlimited).
  double Over(const Evaluation& e) const {
    if (!in_.memory_budget) return 0;
    return std::max(0.0, e.peak_memory - *in_.memory_budget);
  }

 private:
  static double Sum(const std::vector<long double>& prefix, int begin,
                    int end) {
    return static_cast<double>(prefix[end] - prefix[begin]);
  }

  const StageSearchInput& in_;
  Schedule schedule_;
  std::vector<long double> forward_, backward_input_, backward_weight_,
      activation_, state_;
};

// A split the local search reached.
struct Candidate {
  std::vector<int> stage_begin;
  double makespan = 0;
  bool fits = false;  // within the memory budget
};

// Among `candidates` that fit, one with the smallest makespan, makespans
// within the tie tolerance of it going to the lexicographically largest
// stage_begin. nullopt when none fits.
std::optional<std::vector<int>> PickBest(
    const std::vector<Candidate>& candidates) {
  std::optional<double> best;
  for (const Candidate& c : candidates) {
    if (c.fits && (!best || c.makespan < *best)) best = c.makespan;
  }
  if (!best) return std::nullopt;
  const std::vector<int>* pick = nullptr;
  for (const Candidate& c : candidates) {
    if (c.fits && WithinTolerance(c.makespan, *best) &&
        (pick == nullptr || c.stage_begin > *pick)) {
      pick = &c.stage_begin;
    }
  }
  return *pick;
}

constexpr absl::string_view kSmallestPeakUrl =
    "type.conveyor/stage_search.smallest_peak";

absl::Status NoSplitFits(const Evaluator& ev, double budget,
                         double smallest_peak) {
  absl::Status status = absl::InvalidArgumentError(absl::StrCat(
      "memory_budget: no split of ", ev.layers(), " layers into ", ev.stages(),
      " stages fits ", Bytes(budget),
      " bytes per device; the smallest peak any examined split needs is ",
      Bytes(std::ceil(smallest_peak)), " bytes"));
  status.SetPayload(kSmallestPeakUrl,
                    absl::Cord(absl::StrCat(std::ceil(smallest_peak))));
  return status;
}

// Simulates every split that respects the fixed boundaries.
absl::StatusOr<std::vector<int>> Exhaustive(const StageSearchInput& in,
                                            const Evaluator& ev,
                                            int64_t* simulations) {
  // Only the makespans are kept; the winner is found again by index.
  std::vector<double> makespan;
  std::vector<unsigned char> fits;
  double smallest_peak = std::numeric_limits<double>::infinity();
  std::vector<int> stage_begin;
  for (SplitEnumerator splits(ev.layers(), ev.stages(), in.fixed_boundaries);
       splits.Next(&stage_begin);) {
    ASSIGN_OR_RETURN(const Evaluation e, ev.Evaluate(stage_begin));
    ++*simulations;
    makespan.push_back(e.makespan);
    fits.push_back(ev.Over(e) == 0);
    smallest_peak = std::min(smallest_peak, e.peak_memory);
  }
  std::optional<double> best;
  for (size_t i = 0; i < makespan.size(); ++i) {
    if (fits[i] && (!best || makespan[i] < *best)) best = makespan[i];
  }
  if (!best) return NoSplitFits(ev, *in.memory_budget, smallest_peak);
  // Later splits are lexicographically larger: take the last tie.
  size_t pick = 0;
  for (size_t i = 0; i < makespan.size(); ++i) {
    if (fits[i] && WithinTolerance(makespan[i], *best)) pick = i;
  }
  SplitEnumerator splits(ev.layers(), ev.stages(), in.fixed_boundaries);
  for (size_t i = 0; i <= pick; ++i) {
    CONVEYOR_CHECK(splits.Next(&stage_begin), "the enumeration repeats");
  }
  return stage_begin;
}

// The local search's objective: first the amount over budget, then the
// makespan.
struct Score {
  double over = 0;
  double makespan = 0;
};

// Whether a split scoring `a` should replace one scoring `b`: less over the
// budget, or a makespan shorter beyond the tie tolerance, or (as exhaustive
// search breaks ties) a tie within the tolerance that is lexicographically
// larger. A tie is taken only when its makespan is no longer in fact, so a
// chain of ties cannot creep upward; (over, makespan, reversed stage_begin)
// then strictly decreases along the moves, and the search cannot cycle.
bool Better(const Score& a, const Score& b, bool a_lexicographically_larger) {
  if (a.over != b.over) return a.over < b.over;
  if (!WithinTolerance(b.makespan, a.makespan)) return true;
  return a_lexicographically_larger && a.makespan <= b.makespan;
}

absl::StatusOr<std::vector<int>> LocalSearch(const StageSearchInput& in,
                                             const Evaluator& ev,
                                             int64_t* simulations) {
  const int layers = ev.layers(), stages = ev.stages();
  std::vector<double> layer_time;
  for (const LayerCosts& c : in.layers) {
    layer_time.push_back(c.forward + c.backward_input + c.backward_weight);
  }
  ASSIGN_OR_RETURN(std::vector<int> balanced,
                   SeedSplit(layer_time, in.fixed_boundaries, stages,
                             /*uniform=*/false));
  ASSIGN_OR_RETURN(std::vector<int> uniform,
                   SeedSplit(std::vector<double>(layers, 1.0),
                             in.fixed_boundaries, stages, /*uniform=*/true));

  // Splits revisited (neighbouring moves, the second seed's path) are
  // simulated once.
  std::map<std::vector<int>, Score> memo;
  double smallest_peak = std::numeric_limits<double>::infinity();
  auto score =
      [&](const std::vector<int>& stage_begin) -> absl::StatusOr<Score> {
    if (auto it = memo.find(stage_begin); it != memo.end()) return it->second;
    ASSIGN_OR_RETURN(const Evaluation e, ev.Evaluate(stage_begin));
    ++*simulations;
    smallest_peak = std::min(smallest_peak, e.peak_memory);
    const Score s = {.over = ev.Over(e), .makespan = e.makespan};
    memo.emplace(stage_begin, s);
    return s;
  };

  std::vector<Candidate> candidates;
  for (std::vector<int> split : {std::move(balanced), std::move(uniform)}) {
    CONVEYOR_CHECK(CheckSplit(split, layers, stages).ok() &&
                       std::includes(split.begin(), split.end(),
                                     in.fixed_boundaries.begin(),
                                     in.fixed_boundaries.end()),
                   "a seed is a split that keeps the fixed boundaries");
    ASSIGN_OR_RETURN(Score current, score(split));
    candidates.push_back({.stage_begin = split,
                          .makespan = current.makespan,
                          .fits = current.over == 0});
    // Boundaries that are not fixed; they stay strictly between their
    // neighbours, so the fixed ones keep their places.
    std::vector<int> movable;
    for (int i = 1; i < stages; ++i) {
      if (!std::binary_search(in.fixed_boundaries.begin(),
                              in.fixed_boundaries.end(), split[i])) {
        movable.push_back(i);
      }
    }
    for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
      bool improved = false;
      for (int i : movable) {
        const int lo = split[i - 1] + 1;
        const int hi = (i + 1 < stages ? split[i + 1] : layers) - 1;
        const int from = split[i];
        int best_at = from;
        Score best = current;
        for (int at = lo; at <= hi; ++at) {
          if (at == from) continue;
          if (*simulations >= ev.SimulationBudget()) break;
          split[i] = at;
          ASSIGN_OR_RETURN(const Score s, score(split));
          // Only position i differs from the best so far.
          if (Better(s, best, /*a_lexicographically_larger=*/at > best_at)) {
            best = s;
            best_at = at;
          }
        }
        split[i] = best_at;
        if (best_at != from) {
          current = best;
          improved = true;
        }
      }
      if (!improved) break;
    }
    candidates.push_back({.stage_begin = split,
                          .makespan = current.makespan,
                          .fits = current.over == 0});
  }
  std::optional<std::vector<int>> best = PickBest(candidates);
  if (!best) return NoSplitFits(ev, *in.memory_budget, smallest_peak);
  return *std::move(best);
}

// The result for `stage_begin`, with the uniform comparison.
absl::StatusOr<StageSearchResult> Finish(const StageSearchInput& in,
                                         const Evaluator& ev,
                                         std::vector<int> stage_begin,
                                         bool exhaustive, int64_t simulations) {
  ASSIGN_OR_RETURN(Evaluation e, ev.Evaluate(stage_begin));
  StageSearchResult r;
  r.stage_begin = std::move(stage_begin);
  r.makespan = e.makespan;
  r.bubble_fraction = e.bubble_fraction;
  r.stage_time = std::move(e.stage_time);
  r.stage_memory = std::move(e.stage_memory);
  r.rank_memory = std::move(e.rank_memory);
  r.even_stage_begin = UniformSplit(ev.layers(), ev.stages());
  if (std::includes(r.even_stage_begin.begin(), r.even_stage_begin.end(),
                    in.fixed_boundaries.begin(), in.fixed_boundaries.end())) {
    if (r.even_stage_begin == r.stage_begin) {
      if (ev.Over(e) == 0) r.even_makespan = r.makespan;
    } else {
      ASSIGN_OR_RETURN(const Evaluation even, ev.Evaluate(r.even_stage_begin));
      if (ev.Over(even) == 0) r.even_makespan = even.makespan;
    }
  }
  r.exhaustive = exhaustive;
  r.simulations = simulations;
  return r;
}

}  // namespace

absl::StatusOr<StageSearchResult> SearchStages(const StageSearchInput& input) {
  ASSIGN_OR_RETURN(Schedule schedule, CheckInputAndGenerate(input));
  const Evaluator ev(input, std::move(schedule));
  const int64_t cap =
      input.exhaustive_limit == std::numeric_limits<int64_t>::max()
          ? input.exhaustive_limit
          : input.exhaustive_limit + 1;
  const int64_t count =
      SplitEnumerator(ev.layers(), ev.stages(), input.fixed_boundaries)
          .Count(cap);
  const bool exhaustive =
      count <= input.exhaustive_limit && count <= ev.SimulationBudget();
  int64_t simulations = 0;
  ASSIGN_OR_RETURN(std::vector<int> best,
                   exhaustive ? Exhaustive(input, ev, &simulations)
                              : LocalSearch(input, ev, &simulations));
  return Finish(input, ev, std::move(best), exhaustive, simulations);
}

absl::StatusOr<StageSearchResult> EvaluateSplit(
    const StageSearchInput& input, const std::vector<int>& stage_begin) {
  ASSIGN_OR_RETURN(Schedule schedule, CheckInputAndGenerate(input));
  const Evaluator ev(input, std::move(schedule));
  RETURN_IF_ERROR(CheckSplit(stage_begin, ev.layers(), ev.stages()));
  return Finish(input, ev, stage_begin, /*exhaustive=*/false,
                /*simulations=*/1);
}

std::optional<double> SmallestPeakOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kSmallestPeakUrl);
  double peak = 0;
  if (!payload.has_value() || !absl::SimpleAtod(std::string(*payload), &peak)) {
    return std::nullopt;
  }
  return peak;
}

}  // namespace conveyor::scheduler
