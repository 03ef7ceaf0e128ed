#include "cli/trace_render.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/median.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "scheduler/action.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"
#include "telemetry/step_timeline.h"

namespace conveyor::cli {
namespace {

using scheduler::Action;
using scheduler::Op;

// The Chrome trace tracks of a rank.
constexpr int kComputeTid = 1;
constexpr int kCommunicationTid = 2;
constexpr int kIdleTid = 3;

enum class Stream { kCompute, kCommunication, kIdle, kUnknown };

Stream StreamOf(int kind) {
  switch (kind) {
    case v1::Span::FORWARD:
    case v1::Span::BACKWARD:
    case v1::Span::BACKWARD_INPUT:
    case v1::Span::BACKWARD_WEIGHT:
    case v1::Span::LOSS:
    case v1::Span::DATA:
    case v1::Span::OPTIMIZER:
      return Stream::kCompute;
    case v1::Span::SEND:
    case v1::Span::ALL_REDUCE:
      return Stream::kCommunication;
    case v1::Span::RECV_WAIT:
      return Stream::kIdle;
    default:
      return Stream::kUnknown;
  }
}

std::optional<Op> OpOf(int kind) { return telemetry::SpanOp(kind); }

std::string SpanName(const v1::Span& span) {
  if (std::optional<Op> op = OpOf(span.kind())) {
    if (span.stage() >= 0 && span.microbatch() >= 0) {
      return scheduler::ToString(Action{*op, span.stage(), span.microbatch()});
    }
    // Without a stage or microbatch the notation would read "F-1.-1".
    return std::string(scheduler::OpName(*op));
  }
  switch (span.kind()) {
    case v1::Span::LOSS:
      return "loss";
    case v1::Span::DATA:
      return "data";
    case v1::Span::SEND:
      return "send";
    case v1::Span::RECV_WAIT:
      return "recv wait";
    case v1::Span::OPTIMIZER:
      return "optimizer";
    case v1::Span::ALL_REDUCE:
      return "all-reduce";
    default:
      return absl::StrCat("span ", static_cast<int>(span.kind()));
  }
}

// Wall-clock microseconds come from other hosts; saturate rather than
// overflow (undefined behaviour) on garbage.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? std::numeric_limits<int64_t>::max()
               : std::numeric_limits<int64_t>::min();
}

int64_t SaturatingSub(int64_t a, int64_t b) {
  int64_t diff;
  if (!__builtin_sub_overflow(a, b, &diff)) return diff;
  return b < 0 ? std::numeric_limits<int64_t>::max()
               : std::numeric_limits<int64_t>::min();
}

// The axis origin of both renderers: the earliest rank's step start.
int64_t EarliestStart(const v1::Trace& trace) {
  if (trace.ranks().empty()) return 0;
  int64_t earliest = std::numeric_limits<int64_t>::max();
  for (const v1::RankTrace& rank : trace.ranks()) {
    earliest = std::min(earliest, rank.start_unix_us());
  }
  return earliest;
}

std::string ProcessName(const v1::RankTrace& rank) {
  std::string name = absl::StrCat("rank ", rank.rank());
  if (!rank.worker_name().empty()) {
    absl::StrAppend(&name, ": ", rank.worker_name());
    if (!rank.worker_id().empty() && rank.worker_id() != rank.worker_name()) {
      absl::StrAppend(&name, " (", rank.worker_id(), ")");
    }
  } else if (!rank.worker_id().empty()) {
    absl::StrAppend(&name, ": ", rank.worker_id());
  }
  return name;
}

nlohmann::json Metadata(absl::string_view name, int pid, int tid,
                        nlohmann::json args) {
  return {{"ph", "M"},
          {"name", std::string(name)},
          {"pid", pid},
          {"tid", tid},
          {"args", std::move(args)}};
}

// Fixed-point text with `decimals` places; std::to_chars ignores the locale,
// so the table reads the same everywhere.
std::string Fixed(double v, int decimals) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v,
                                 std::chars_format::fixed, decimals);
  if (ec != std::errc()) return "-";
  std::string out(buf, end);
  if (out.find_first_not_of("-0.") == std::string::npos && out[0] == '-') {
    out.erase(0, 1);  // "-0.000" from a tiny negative reads as 0.
  }
  return out;
}

}  // namespace

std::string RenderChromeTrace(const v1::Trace& trace) {
  const int64_t origin = EarliestStart(trace);
  nlohmann::json events = nlohmann::json::array();
  for (const v1::RankTrace& rank : trace.ranks()) {
    // Perfetto reserves pid 0 (the swapper in kernel traces), hence + 1.
    const int pid = rank.rank() + 1;
    events.push_back(
        Metadata("process_name", pid, 0, {{"name", ProcessName(rank)}}));
    events.push_back(
        Metadata("process_sort_index", pid, 0, {{"sort_index", rank.rank()}}));
    for (const auto& [tid, name] :
         {std::pair<int, const char*>{kComputeTid, "compute"},
          {kCommunicationTid, "communication"},
          {kIdleTid, "idle"}}) {
      events.push_back(Metadata("thread_name", pid, tid, {{"name", name}}));
      events.push_back(
          Metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
    }

    const int64_t offset = SaturatingSub(rank.start_unix_us(), origin);
    for (const v1::Span& span : rank.spans()) {
      int tid = kComputeTid;
      const char* category = "compute";
      switch (StreamOf(span.kind())) {
        case Stream::kCompute:
        case Stream::kUnknown:
          break;
        case Stream::kCommunication:
          tid = kCommunicationTid;
          category = "communication";
          break;
        case Stream::kIdle:
          tid = kIdleTid;
          category = "idle";
          break;
      }
      nlohmann::json args = nlohmann::json::object();
      if (span.stage() >= 0) args["stage"] = span.stage();
      if (span.microbatch() >= 0) args["microbatch"] = span.microbatch();
      if (span.peer() >= 0) args["peer"] = span.peer();
      if (span.kind() == v1::Span::SEND || span.kind() == v1::Span::RECV_WAIT ||
          span.bytes() != 0) {
        args["bytes"] = span.bytes();
      }
      events.push_back({{"ph", "X"},
                        {"name", SpanName(span)},
                        {"cat", category},
                        {"pid", pid},
                        {"tid", tid},
                        {"ts", SaturatingAdd(offset, span.start_us())},
                        {"dur", std::max<int64_t>(span.duration_us(), 0)},
                        {"args", std::move(args)}});
    }
  }

  nlohmann::json out = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"job_id", trace.job_id()},
                          {"job_name", trace.job_name()},
                          {"step", trace.step()},
                          {"schedule", trace.schedule()},
                          {"num_ranks", trace.num_ranks()},
                          {"virtual_stages", trace.virtual_stages()},
                          {"microbatches", trace.microbatches()}}}};
  // Worker names come from the workers' command lines; with the default
  // (strict) handler invalid UTF-8 would throw, and exceptions must not leave
  // this module.
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

namespace {

// A trace's actions as a schedule in their measured order, with their
// measured times as the simulation result RenderSvg draws.
struct MeasuredTimeline {
  scheduler::Schedule schedule;
  scheduler::SimulationResult<double> result;
};

// RenderTraceSvg's checks (its comment lists them), then the timeline.
absl::StatusOr<MeasuredTimeline> MeasureTimeline(const v1::Trace& trace) {
  if (trace.ranks().empty()) {
    return absl::InvalidArgumentError("the trace has no ranks to draw");
  }
  const int p = trace.num_ranks();
  if (trace.ranks_size() != p) {
    return absl::InvalidArgumentError(
        absl::StrCat("the trace has ", trace.ranks_size(),
                     " rank timelines but num_ranks is ", p));
  }
  if (trace.virtual_stages() < 1 || trace.microbatches() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the trace's virtual_stages (", trace.virtual_stages(),
        ") and microbatches (", trace.microbatches(), ") must be at least 1"));
  }
  scheduler::Schedule schedule;
  {
    absl::StatusOr<scheduler::ScheduleKind> kind =
        scheduler::ParseScheduleKind(trace.schedule());
    if (!kind.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the trace's schedule: ", kind.status().message()));
    }
    schedule.kind = *kind;
    schedule.placement = scheduler::PlacementOf(*kind);
  }
  schedule.ranks = p;
  schedule.virtual_stages = trace.virtual_stages();
  schedule.microbatches = trace.microbatches();
  // Also keeps P*V within int for num_stages() below.
  if (schedule.StageMicrobatches() > scheduler::kMaxStageMicrobatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("P*V*M = ", schedule.StageMicrobatches(),
                     " is too large to draw (at most ",
                     scheduler::kMaxStageMicrobatches, ")"));
  }
  const int num_stages = schedule.num_stages();
  schedule.actions.resize(p);

  scheduler::SimulationResult<double> result;
  result.busy.assign(p, 0);
  result.idle.assign(p, 0);
  result.peak_inflight.assign(p, 0);
  result.peak_pending_weight_grads.assign(p, 0);
  result.timings.resize(p);

  const int64_t origin = EarliestStart(trace);
  std::set<int> seen_ranks;
  std::vector<telemetry::RankSpans> rank_spans(p);
  for (const v1::RankTrace& rank_trace : trace.ranks()) {
    const int r = rank_trace.rank();
    if (r < 0 || r >= p || !seen_ranks.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, " is out of range [0, ", p, ") or appears twice"));
    }
    for (const v1::Span& span : rank_trace.spans()) {
      if (span.start_us() < 0 || span.duration_us() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " has a ", SpanName(span), " span with start ",
            span.start_us(), " us and duration ", span.duration_us(),
            " us; times must not be negative"));
      }
      if (OpOf(span.kind()) &&
          (span.stage() < 0 || span.stage() >= num_stages ||
           schedule.RankOfStage(span.stage()) != r || span.microbatch() < 0 ||
           span.microbatch() >= schedule.microbatches)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " has a ", SpanName(span), " span (stage ",
            span.stage(), ", microbatch ", span.microbatch(),
            ") that is not one of its stages' actions (P=", p, ", V=",
            schedule.virtual_stages, ", M=", schedule.microbatches, ")"));
      }
    }
    rank_spans[r] = {rank_trace.start_unix_us(), &rank_trace.spans()};
  }
  // A rank the trace lacks has no spans.
  const google::protobuf::RepeatedPtrField<v1::Span> none;
  for (telemetry::RankSpans& rank : rank_spans) {
    if (rank.spans == nullptr) rank = {origin, &none};
  }
  const std::vector<std::vector<telemetry::ActionBox>> boxes =
      telemetry::ActionBoxes(rank_spans, origin);
  for (int r = 0; r < p; ++r) {
    auto& actions = schedule.actions[r];
    auto& timings = result.timings[r];
    int inflight = 0, pending_weight = 0;
    for (const telemetry::ActionBox& box : boxes[r]) {
      actions.push_back({box.op, box.stage, box.microbatch});
      timings.push_back({box.start_ms, box.end_ms});
      result.busy[r] += box.end_ms - box.start_ms;
      result.makespan = std::max(result.makespan, box.end_ms);
      // The same bookkeeping as the simulator, over the measured order.
      switch (box.op) {
        case Op::kForward:
          result.peak_inflight[r] =
              std::max(result.peak_inflight[r], ++inflight);
          break;
        case Op::kBackward:
          --inflight;
          break;
        case Op::kBackwardInput:
          result.peak_pending_weight_grads[r] =
              std::max(result.peak_pending_weight_grads[r], ++pending_weight);
          break;
        case Op::kBackwardWeight:
          --pending_weight;
          --inflight;
          break;
      }
    }
  }
  for (int r = 0; r < p; ++r) result.idle[r] = result.makespan - result.busy[r];
  return MeasuredTimeline{std::move(schedule), std::move(result)};
}

}  // namespace

absl::StatusOr<std::string> RenderTraceSvg(const v1::Trace& trace,
                                           scheduler::SvgOptions options) {
  ASSIGN_OR_RETURN(MeasuredTimeline measured, MeasureTimeline(trace));
  if (options.title.empty()) {
    options.title =
        absl::StrCat(trace.job_id(), " step ", trace.step(), " (measured)");
  }
  options.time_unit = "ms";
  return scheduler::RenderSvg(measured.schedule, measured.result, options);
}

absl::StatusOr<BubbleBreakdown> ExplainBubble(const v1::Trace& trace) {
  ASSIGN_OR_RETURN(MeasuredTimeline measured, MeasureTimeline(trace));
  const scheduler::Schedule& schedule = measured.schedule;
  const int num_stages = schedule.num_stages();
  // durations[op][stage]: the measured boxes of that op on that stage.
  std::vector<std::vector<std::vector<double>>> durations(
      4, std::vector<std::vector<double>>(num_stages));
  for (int r = 0; r < schedule.ranks; ++r) {
    for (size_t i = 0; i < schedule.actions[r].size(); ++i) {
      const Action& a = schedule.actions[r][i];
      const scheduler::ActionTiming<double>& t = measured.result.timings[r][i];
      durations[static_cast<int>(a.op)][a.stage].push_back(t.end - t.start);
    }
  }
  // Per op the stages' medians, and their mean for every stage; nothing for
  // an op the step did not run (B or BI/BW).
  scheduler::SimulationCosts<double> staged, uniform;
  auto fill = [&](Op op, std::vector<double>& per_stage,
                  std::vector<double>& mean) {
    const auto& by_stage = durations[static_cast<int>(op)];
    if (std::all_of(by_stage.begin(), by_stage.end(),
                    [](const std::vector<double>& d) { return d.empty(); })) {
      return;
    }
    double sum = 0;
    for (const std::vector<double>& d : by_stage) {
      per_stage.push_back(Median(d));
      sum += per_stage.back();
    }
    mean = {sum / num_stages};
  };
  fill(Op::kForward, staged.forward, uniform.forward);
  fill(Op::kBackward, staged.backward, uniform.backward);
  fill(Op::kBackwardInput, staged.backward_input, uniform.backward_input);
  fill(Op::kBackwardWeight, staged.backward_weight, uniform.backward_weight);
  ASSIGN_OR_RETURN(const scheduler::SimulationResult<double> at_stages,
                   scheduler::Simulate(schedule, staged));
  ASSIGN_OR_RETURN(const scheduler::SimulationResult<double> at_uniform,
                   scheduler::Simulate(schedule, uniform));
  return BubbleBreakdown{.measured = measured.result.bubble_fraction(),
                         .at_stage_costs = at_stages.bubble_fraction(),
                         .at_uniform_costs = at_uniform.bubble_fraction()};
}

std::string FormatBubbleBreakdown(const BubbleBreakdown& bubble) {
  auto percent = [](double fraction) {
    return absl::StrCat(Fixed(100 * fraction, 1), "%");
  };
  auto points = [](double difference) {
    // Rounded first, so that a difference smaller than shown reads +0.0.
    const double tenths = std::round(1000 * difference);
    return absl::StrCat(tenths < 0 ? "-" : "+",
                        Fixed(std::abs(tenths) / 10, 1));
  };
  return absl::StrCat(
      "bubble ", percent(bubble.measured),
      " measured; simulated for these actions: ",
      percent(bubble.at_stage_costs), " at this step's stage costs, ",
      percent(bubble.at_uniform_costs), " at uniform stages (stage imbalance ",
      points(bubble.at_stage_costs - bubble.at_uniform_costs),
      " points; communication, runtime and uneven actions ",
      points(bubble.measured - bubble.at_stage_costs), ")\n");
}

std::vector<RankAccounting> AccountTrace(const v1::Trace& trace) {
  std::vector<RankAccounting> rows;
  rows.reserve(trace.ranks_size());
  for (const v1::RankTrace& rank : trace.ranks()) {
    int64_t compute_us = 0, communication_us = 0, idle_us = 0;
    for (const v1::Span& span : rank.spans()) {
      int64_t* sum = nullptr;
      switch (StreamOf(span.kind())) {
        case Stream::kCompute:
          sum = &compute_us;
          break;
        case Stream::kCommunication:
          sum = &communication_us;
          break;
        case Stream::kIdle:
          sum = &idle_us;
          break;
        case Stream::kUnknown:
          continue;
      }
      *sum = SaturatingAdd(*sum, span.duration_us());
    }
    rows.push_back(
        {.rank = rank.rank(),
         .compute_seconds = static_cast<double>(compute_us) / 1e6,
         .communication_seconds = static_cast<double>(communication_us) / 1e6,
         .idle_seconds = static_cast<double>(idle_us) / 1e6,
         .step_seconds = rank.seconds()});
  }
  return rows;
}

std::string FormatAccounting(const std::vector<RankAccounting>& rows) {
  std::vector<std::vector<std::string>> cells = {
      {"RANK", "COMPUTE", "COMMUNICATION", "IDLE", "STEP", "ACCOUNTED"}};
  auto millis = [](double seconds) {
    return absl::StrCat(Fixed(seconds * 1e3, 3), " ms");
  };
  for (const RankAccounting& row : rows) {
    const double accounted =
        row.compute_seconds + row.communication_seconds + row.idle_seconds;
    cells.push_back(
        {absl::StrCat(row.rank), millis(row.compute_seconds),
         millis(row.communication_seconds), millis(row.idle_seconds),
         millis(row.step_seconds),
         row.step_seconds > 0
             ? absl::StrCat(Fixed(100 * accounted / row.step_seconds, 1), "%")
             : std::string("-")});
  }
  std::vector<size_t> widths(cells[0].size(), 0);
  for (const auto& line : cells) {
    for (size_t c = 0; c < line.size(); ++c) {
      widths[c] = std::max(widths[c], line[c].size());
    }
  }
  std::string out;
  for (const auto& line : cells) {
    std::string text;
    for (size_t c = 0; c < line.size(); ++c) {
      absl::StrAppend(&text, line[c]);
      if (c + 1 < line.size()) {
        text.append(widths[c] - line[c].size() + 2, ' ');
      }
    }
    // The last column is not padded, so no line has trailing spaces.
    absl::StrAppend(&out, text, "\n");
  }
  return out;
}

}  // namespace conveyor::cli
