#include "scheduler/simulator.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::scheduler {
namespace {

// A cost vector holds one entry per item or one entry for all of them.
template <typename T>
absl::Status CheckCostVector(const std::vector<T>& v, size_t items,
                             absl::string_view name, bool required) {
  if (v.empty()) {
    if (required) {
      return absl::InvalidArgumentError(
          absl::StrCat("costs: '", name, "' is needed by this schedule"));
    }
    return absl::OkStatus();
  }
  if (v.size() != 1 && v.size() != items) {
    return absl::InvalidArgumentError(
        absl::StrCat("costs: '", name, "' has ", v.size(),
                     " entries; expected 1 or ", items));
  }
  for (T x : v) {
    if (!(x >= 0) || !std::isfinite(static_cast<double>(x))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "costs: '", name, "' entries must be finite and >= 0, got ", x));
    }
  }
  return absl::OkStatus();
}

template <typename T>
T At(const std::vector<T>& v, int i) {
  return v.size() == 1 ? v[0] : v[i];
}

// *sum += x, reporting whether the result is representable. Only integer time
// can overflow; doubles go to infinity, which the caller's bound catches.
template <typename T>
bool AddChecked(T* sum, T x) {
  if constexpr (std::is_integral_v<T>) {
    return !__builtin_add_overflow(*sum, x, sum);
  } else {
    *sum += x;
    return std::isfinite(static_cast<double>(*sum));
  }
}

}  // namespace

template <typename T>
SimulationCosts<T> SimulationCosts<T>::Uniform(T f, T b) {
  SimulationCosts c;
  c.forward = {f};
  c.backward = {b};
  return c;
}

template <typename T>
SimulationCosts<T> SimulationCosts<T>::UniformSplit(T f, T bi, T bw) {
  SimulationCosts c;
  c.forward = {f};
  // B = BI + BW, summed by Simulate (which checks the sum for overflow).
  c.backward_input = {bi};
  c.backward_weight = {bw};
  return c;
}

template <typename T>
double SimulationResult<T>::bubble_fraction() const {
  if (makespan <= 0 || idle.empty()) return 0.0;
  double total_idle = 0;
  for (T x : idle) total_idle += static_cast<double>(x);
  return total_idle / (static_cast<double>(makespan) * idle.size());
}

template <typename T>
absl::StatusOr<SimulationResult<T>> Simulate(const Schedule& schedule,
                                             const SimulationCosts<T>& costs) {
  const int p = schedule.ranks;
  const int m = schedule.microbatches;
  if (p < 1 || m < 1 || schedule.virtual_stages < 1 ||
      static_cast<int>(schedule.actions.size()) != p) {
    return absl::InvalidArgumentError(
        "schedule shape is inconsistent (ranks, virtual stages, microbatches "
        "and the action lists disagree)");
  }
  if (schedule.StageMicrobatches() > kMaxStageMicrobatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("P*V*M = ", schedule.StageMicrobatches(),
                     " stage-microbatches is too large to simulate (at most ",
                     kMaxStageMicrobatches, ")"));
  }
  const int num_stages = schedule.num_stages();  // Small enough now.
  // The placement's rank of each stage, looked up for every action below.
  std::vector<int> rank_of(num_stages);
  for (int st = 0; st < num_stages; ++st) {
    rank_of[st] = schedule.RankOfStage(st);
  }

  bool has_full_backward = false, has_split_backward = false;
  for (int r = 0; r < p; ++r) {
    for (const Action& a : schedule.actions[r]) {
      if (a.stage < 0 || a.stage >= num_stages || a.microbatch < 0 ||
          a.microbatch >= m || rank_of[a.stage] != r) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " has action ", ToString(a),
                         " outside its stages or microbatches; run the "
                         "validator"));
      }
      has_full_backward |= a.op == Op::kBackward;
      has_split_backward |=
          a.op == Op::kBackwardInput || a.op == Op::kBackwardWeight;
    }
  }
  RETURN_IF_ERROR(CheckCostVector(costs.forward, num_stages, "forward", true));
  RETURN_IF_ERROR(CheckCostVector(costs.backward_input, num_stages,
                                  "backward_input", has_split_backward));
  RETURN_IF_ERROR(CheckCostVector(costs.backward_weight, num_stages,
                                  "backward_weight", has_split_backward));
  const bool backward_from_split = costs.backward.empty() &&
                                   !costs.backward_input.empty() &&
                                   !costs.backward_weight.empty();
  RETURN_IF_ERROR(CheckCostVector(costs.backward, num_stages, "backward",
                                  has_full_backward && !backward_from_split));
  RETURN_IF_ERROR(CheckCostVector(costs.activation_bytes,
                                  std::max(num_stages - 1, 1),
                                  "activation_bytes", false));
  if (!(costs.latency >= 0) || !(costs.bytes_per_time >= 0)) {
    return absl::InvalidArgumentError(
        "costs: latency and bytes_per_time must be >= 0");
  }

  // Transfer time across boundary s -> s+1 (and its gradient back).
  std::vector<T> transfer(std::max(num_stages - 1, 0), costs.latency);
  if (costs.bytes_per_time > 0 && !costs.activation_bytes.empty()) {
    for (int s = 0; s + 1 < num_stages; ++s) {
      const T bytes = At(costs.activation_bytes, s);
      if constexpr (std::is_integral_v<T>) {
        if (bytes % costs.bytes_per_time != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "costs: with integer time, activation bytes (", bytes,
              ") must be a multiple of bytes_per_time (", costs.bytes_per_time,
              "); use floating-point costs instead"));
        }
      }
      if (!AddChecked(&transfer[s], bytes / costs.bytes_per_time)) {
        return absl::InvalidArgumentError(
            "costs: latency + bytes / bytes_per_time is too large");
      }
    }
  }
  // Per-stage durations, looked up once per action below.
  std::vector<T> forward_cost(num_stages), backward_cost(num_stages),
      input_cost(num_stages), weight_cost(num_stages);
  for (int st = 0; st < num_stages; ++st) {
    forward_cost[st] = At(costs.forward, st);
    if (!costs.backward_input.empty()) {
      input_cost[st] = At(costs.backward_input, st);
    }
    if (!costs.backward_weight.empty()) {
      weight_cost[st] = At(costs.backward_weight, st);
    }
    if (backward_from_split) {
      backward_cost[st] = input_cost[st];
      if (!AddChecked(&backward_cost[st], weight_cost[st])) {
        return absl::InvalidArgumentError(
            "costs: backward_input + backward_weight is too large");
      }
    } else if (!costs.backward.empty()) {
      backward_cost[st] = At(costs.backward, st);
    }
  }
  auto duration = [&](const Action& a) -> T {
    switch (a.op) {
      case Op::kForward:
        return forward_cost[a.stage];
      case Op::kBackward:
        return backward_cost[a.stage];
      case Op::kBackwardInput:
        return input_cost[a.stage];
      case Op::kBackwardWeight:
        return weight_cost[a.stage];
    }
    return 0;
  };

  // Every instant before the makespan is spent in some action or some
  // transfer on the critical path, and each action sends at most one tensor,
  // so the sum over actions of (duration + the longest transfer) bounds every
  // time the simulation computes. Checking it once here keeps the main loop
  // free of overflow checks.
  {
    const T longest_transfer =
        transfer.empty() ? T{0}
                         : *std::max_element(transfer.begin(), transfer.end());
    T bound = 0;
    bool fits = true;
    for (const auto& program : schedule.actions) {
      for (const Action& a : program) {
        fits &= AddChecked(&bound, duration(a));
        fits &= AddChecked(&bound, longest_transfer);
      }
    }
    if (!fits) {
      return absl::InvalidArgumentError(
          std::is_integral_v<T>
              ? "costs: the schedule's total time overflows 64-bit integer "
                "time; use smaller units or fractional costs"
              : "costs: the schedule's total time is not finite");
    }
  }

  // End times of the producers an action may wait for, by (stage, mb).
  const size_t cells = static_cast<size_t>(num_stages) * m;
  std::vector<T> forward_end(cells), grad_end(cells), input_grad_end(cells);
  std::vector<unsigned char> forward_done(cells), grad_done(cells),
      input_grad_done(cells);
  auto cell = [m](int stage, int mb) {
    return static_cast<size_t>(stage) * m + mb;
  };

  SimulationResult<T> result;
  result.busy.assign(p, 0);
  result.idle.assign(p, 0);
  result.peak_inflight.assign(p, 0);
  result.peak_pending_weight_grads.assign(p, 0);
  result.timings.resize(p);
  for (int r = 0; r < p; ++r) {
    result.timings[r].resize(schedule.actions[r].size());
  }
  std::vector<T> free_at(p, 0);
  std::vector<size_t> next(p, 0);
  std::vector<int> inflight(p, 0), pending_weight(p, 0);

  // What a blocked rank waits for: the forward or the gradient (B or BI)
  // of a (stage, microbatch) cell on another rank.
  auto forward_key = [](size_t c) { return static_cast<int64_t>(2 * c); };
  auto grad_key = [](size_t c) { return static_cast<int64_t>(2 * c + 1); };

  // Earliest start of `a` given its inputs, or false if an input is missing
  // (with *waits_for set to it).
  auto ready_time = [&](const Action& a, T* t, int64_t* waits_for) -> bool {
    const int s = a.stage, j = a.microbatch;
    const int rank = rank_of[s];
    switch (a.op) {
      case Op::kForward: {
        if (s == 0) return true;
        const size_t input = cell(s - 1, j);
        if (!forward_done[input]) {
          *waits_for = forward_key(input);
          return false;
        }
        *t =
            std::max(*t, forward_end[input] +
                             (rank_of[s - 1] == rank ? T{0} : transfer[s - 1]));
        return true;
      }
      case Op::kBackward:
      case Op::kBackwardInput: {
        const size_t own = cell(s, j);
        if (!forward_done[own]) {
          *waits_for = forward_key(own);
          return false;
        }
        *t = std::max(*t, forward_end[own]);
        if (s + 1 == num_stages) return true;
        const size_t output = cell(s + 1, j);
        if (!grad_done[output]) {
          *waits_for = grad_key(output);
          return false;
        }
        *t = std::max(*t, grad_end[output] +
                              (rank_of[s + 1] == rank ? T{0} : transfer[s]));
        return true;
      }
      case Op::kBackwardWeight:
        if (!input_grad_done[cell(s, j)]) {
          *waits_for = -1;  // Only its own rank's BI produces it.
          return false;
        }
        *t = std::max(*t, input_grad_end[cell(s, j)]);
        return true;
    }
    return false;
  };

  size_t remaining = schedule.TotalActions();
  // Each rank runs as far as its inputs allow, then waits for the one input
  // it lacks; the action producing it puts the rank back on the worklist.
  // An action's start depends only on its inputs and its rank's previous
  // action, so the order ranks are run in does not change any time, and
  // every action is tried O(1) times.
  std::vector<int> work(p);
  for (int r = 0; r < p; ++r) work[r] = p - 1 - r;
  std::vector<int64_t> blocked_on(p, -1);  // -1: not waiting on another rank.
  auto wake = [&](int rank, int64_t key) {
    if (blocked_on[rank] == key) {
      blocked_on[rank] = -1;
      work.push_back(rank);
    }
  };
  while (!work.empty()) {
    const int r = work.back();
    work.pop_back();
    // The rank's state in locals while it runs: the stores into the result
    // below could otherwise alias them, forcing a reload every action.
    const Action* program = schedule.actions[r].data();
    const size_t n = schedule.actions[r].size();
    ActionTiming<T>* timings = result.timings[r].data();
    size_t i = next[r];
    T free = free_at[r], busy = result.busy[r];
    int in_flight = inflight[r], peak_in_flight = result.peak_inflight[r];
    int pending = pending_weight[r],
        peak_pending = result.peak_pending_weight_grads[r];
    for (; i < n; ++i) {
      const Action& a = program[i];
      T start = free;
      int64_t waits_for = -1;
      if (!ready_time(a, &start, &waits_for)) {
        blocked_on[r] = waits_for;
        break;
      }
      const T end = start + duration(a);
      timings[i] = {start, end};
      busy += end - start;
      free = end;
      const size_t c = cell(a.stage, a.microbatch);
      switch (a.op) {
        case Op::kForward:
          forward_end[c] = end;
          forward_done[c] = 1;
          peak_in_flight = std::max(peak_in_flight, ++in_flight);
          if (a.stage + 1 < num_stages) {
            wake(rank_of[a.stage + 1], forward_key(c));
          }
          break;
        case Op::kBackward:
          grad_end[c] = end;
          grad_done[c] = 1;
          --in_flight;
          if (a.stage > 0) wake(rank_of[a.stage - 1], grad_key(c));
          break;
        case Op::kBackwardInput:
          grad_end[c] = input_grad_end[c] = end;
          grad_done[c] = input_grad_done[c] = 1;
          peak_pending = std::max(peak_pending, ++pending);
          if (a.stage > 0) wake(rank_of[a.stage - 1], grad_key(c));
          break;
        case Op::kBackwardWeight:
          --pending;
          --in_flight;
          break;
      }
    }
    remaining -= i - next[r];
    next[r] = i;
    free_at[r] = free;
    result.busy[r] = busy;
    inflight[r] = in_flight;
    result.peak_inflight[r] = peak_in_flight;
    pending_weight[r] = pending;
    result.peak_pending_weight_grads[r] = peak_pending;
  }
  if (remaining > 0) {
    for (int r = 0; r < p; ++r) {
      if (next[r] < schedule.actions[r].size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "simulation stalled: rank ", r, " can never start action #",
            next[r], " (", ToString(schedule.actions[r][next[r]]),
            ") because an input is never produced before it; "
            "ValidateSchedule explains why"));
      }
    }
  }

  result.makespan =
      p > 0 ? *std::max_element(free_at.begin(), free_at.end()) : T{0};
  for (int r = 0; r < p; ++r) result.idle[r] = result.makespan - result.busy[r];
  return result;
}

template struct SimulationCosts<int64_t>;
template struct SimulationCosts<double>;
template struct SimulationResult<int64_t>;
template struct SimulationResult<double>;
template absl::StatusOr<SimulationResult<int64_t>> Simulate(
    const Schedule&, const SimulationCosts<int64_t>&);
template absl::StatusOr<SimulationResult<double>> Simulate(
    const Schedule&, const SimulationCosts<double>&);

}  // namespace conveyor::scheduler
