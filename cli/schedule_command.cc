#include "cli/schedule_command.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "scheduler/closed_form.h"
#include "scheduler/generators.h"
#include "scheduler/render_json.h"
#include "scheduler/render_svg.h"
#include "scheduler/render_text.h"
#include "scheduler/simulator.h"
#include "scheduler/validator.h"

namespace conveyor::cli {
namespace {

using scheduler::Schedule;
using scheduler::ScheduleKind;
using scheduler::SimulationCosts;
using scheduler::SimulationResult;

// Renderings are built in memory; this keeps the largest (SVG, about 64 bytes
// an action) near 64 MiB instead of exhausting memory.
constexpr size_t kMaxRenderedActions = size_t{1} << 20;

// A number as typed, kept exact when it is an integer so that simulations
// with integer costs use integer time.
struct Number {
  double value = 0;
  std::optional<int64_t> integer;
};

absl::StatusOr<Number> ParseNumber(absl::string_view text,
                                   absl::string_view flag) {
  Number n;
  int64_t i = 0;
  if (absl::SimpleAtoi(text, &i)) {
    n.integer = i;
    n.value = static_cast<double>(i);
  } else if (!absl::SimpleAtod(text, &n.value) || !std::isfinite(n.value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", text, "' is not a number"));
  }
  if (n.value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": must be >= 0, got ", text));
  }
  return n;
}

struct ParsedCosts {
  std::vector<Number> values;  // F,B or F,BI,BW
  Number latency, bandwidth, activation_bytes;
  bool AllIntegers() const {
    for (const Number& n : values) {
      if (!n.integer) return false;
    }
    return latency.integer && bandwidth.integer && activation_bytes.integer &&
           (*bandwidth.integer == 0 ||
            *activation_bytes.integer % *bandwidth.integer == 0);
  }
};

absl::StatusOr<ParsedCosts> ParseCosts(const ScheduleCommandOptions& o,
                                       bool split) {
  ParsedCosts c;
  const std::string costs =
      o.costs.empty() ? (split ? "1,1,1" : "1,2") : o.costs;
  for (absl::string_view part : absl::StrSplit(costs, ',')) {
    ASSIGN_OR_RETURN(Number n, ParseNumber(part, "--costs"));
    c.values.push_back(n);
  }
  if (c.values.size() != 2 && c.values.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--costs: expected F,B or F,BI,BW, got '", costs, "'"));
  }
  if (split && c.values.size() != 3) {
    return absl::InvalidArgumentError(
        "--costs: this schedule splits the backward into BI and BW: give "
        "--costs F,BI,BW");
  }
  auto or_zero = [](const std::string& v) { return v.empty() ? "0" : v; };
  ASSIGN_OR_RETURN(c.latency, ParseNumber(or_zero(o.latency), "--latency"));
  ASSIGN_OR_RETURN(c.bandwidth,
                   ParseNumber(or_zero(o.bandwidth), "--bandwidth"));
  ASSIGN_OR_RETURN(c.activation_bytes, ParseNumber(or_zero(o.activation_bytes),
                                                   "--activation-bytes"));
  return c;
}

template <typename T>
T As(const Number& n) {
  if constexpr (std::is_integral_v<T>) {
    return *n.integer;
  } else {
    return n.value;
  }
}

template <typename T>
SimulationCosts<T> ToCosts(const ParsedCosts& c) {
  SimulationCosts<T> costs =
      c.values.size() == 3
          ? SimulationCosts<T>::UniformSplit(
                As<T>(c.values[0]), As<T>(c.values[1]), As<T>(c.values[2]))
          : SimulationCosts<T>::Uniform(As<T>(c.values[0]), As<T>(c.values[1]));
  costs.latency = As<T>(c.latency);
  costs.bytes_per_time = As<T>(c.bandwidth);
  costs.activation_bytes = {As<T>(c.activation_bytes)};
  return costs;
}

std::string FormatTime(int64_t t) { return absl::StrCat(t); }
std::string FormatTime(double t) { return absl::StrFormat("%.6g", t); }

template <typename T>
std::string RenderSummary(const Schedule& s, const SimulationResult<T>& r) {
  std::string out;
  absl::StrAppend(&out, "makespan: ", FormatTime(r.makespan), "\n");
  absl::StrAppendFormat(&out, "bubble fraction: %.4f (simulated)\n",
                        r.bubble_fraction());
  if (auto f = scheduler::ClosedFormBubbleFraction(
          s.kind, s.ranks, s.microbatches, s.virtual_stages)) {
    absl::StrAppendFormat(&out, "closed form: %.4f = %d/%d (%s)\n", f->value(),
                          f->numerator, f->denominator,
                          scheduler::ClosedFormAssumptions(s.kind));
  } else {
    absl::StrAppend(&out, "closed form: none for these options\n");
  }
  absl::StrAppend(&out, "peak in-flight microbatches per rank: ",
                  absl::StrJoin(r.peak_inflight, " "), "\n");
  std::vector<std::string> idle;
  for (const T& x : r.idle) idle.push_back(FormatTime(x));
  absl::StrAppend(&out, "idle time per rank: ", absl::StrJoin(idle, " "), "\n");
  return out;
}

// A number as it was written: an integer stays one.
nlohmann::json ToJson(const Number& n) {
  if (n.integer.has_value()) return *n.integer;
  return n.value;
}

// The costs the simulation used, so that --from simulates the file again
// with them.
nlohmann::json CostsToJson(const ParsedCosts& c) {
  nlohmann::json per_stage = nlohmann::json::array();
  for (const Number& n : c.values) per_stage.push_back(ToJson(n));
  return {{"per_stage", std::move(per_stage)},
          {"latency", ToJson(c.latency)},
          {"bandwidth", ToJson(c.bandwidth)},
          {"activation_bytes", ToJson(c.activation_bytes)}};
}

std::string CostsText(const ParsedCosts& c) {
  std::vector<std::string> parts;
  for (const Number& n : c.values) parts.push_back(ToJson(n).dump());
  return absl::StrJoin(parts, ",");
}

template <typename T>
absl::StatusOr<std::string> Render(const ScheduleCommandOptions& o,
                                   const Schedule& s, const ParsedCosts& c) {
  ASSIGN_OR_RETURN(SimulationResult<T> r, Simulate(s, ToCosts<T>(c)));
  if (o.format == "json") {
    nlohmann::json j = scheduler::ScheduleToJson(s);
    j["costs"] = CostsToJson(c);
    j["simulation"] = scheduler::SimulationToJson(r);
    if (auto f = scheduler::ClosedFormBubbleFraction(
            s.kind, s.ranks, s.microbatches, s.virtual_stages)) {
      j["simulation"]["closed_form_bubble_fraction"] = f->value();
    } else {
      j["simulation"]["closed_form_bubble_fraction"] = nullptr;
    }
    return j.dump(2) + "\n";
  }
  if (o.format == "svg") {
    scheduler::SvgOptions svg;
    svg.time_unit = "units of --costs";
    return scheduler::RenderSvg(s, r, svg);
  }
  return absl::StrCat(
      absl::StrFormat("%s: P=%d ranks, V=%d, M=%d microbatches, costs %s\n",
                      scheduler::ScheduleKindName(s.kind), s.ranks,
                      s.virtual_stages, s.microbatches, CostsText(c)),
      scheduler::RenderText(s), RenderSummary(s, r));
}

// Reads and structurally parses a schedule file, then validates it: a
// hand-written schedule is user input, so a violation is InvalidArgument.
// The "costs" --format json wrote, as the flags' text, into the options the
// user left empty: flags override the file.
absl::Status ApplyFileCosts(const nlohmann::json& root, const std::string& path,
                            ScheduleCommandOptions& o) {
  auto it = root.find("costs");
  if (it == root.end()) return absl::OkStatus();
  auto bad = [&](const std::string& key, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from: ", path, ": costs", key, ": ", what));
  };
  if (!it->is_object()) return bad("", "expected an object");
  auto text = [&](const nlohmann::json& v,
                  const std::string& key) -> absl::StatusOr<std::string> {
    if (!v.is_number() || v.get<double>() < 0) {
      return bad(key, absl::StrCat("expected a number >= 0, got ", v.dump()));
    }
    return v.dump();
  };
  if (auto p = it->find("per_stage"); p != it->end() && o.costs.empty()) {
    if (!p->is_array() || (p->size() != 2 && p->size() != 3)) {
      return bad(".per_stage", "expected [F, B] or [F, BI, BW]");
    }
    std::vector<std::string> parts;
    for (size_t i = 0; i < p->size(); ++i) {
      ASSIGN_OR_RETURN(std::string v,
                       text((*p)[i], absl::StrCat(".per_stage[", i, "]")));
      parts.push_back(v);
    }
    o.costs = absl::StrJoin(parts, ",");
  }
  for (auto [key, field] :
       {std::pair{"latency", &o.latency}, std::pair{"bandwidth", &o.bandwidth},
        std::pair{"activation_bytes", &o.activation_bytes}}) {
    if (auto v = it->find(key); v != it->end() && field->empty()) {
      ASSIGN_OR_RETURN(*field, text(*v, absl::StrCat(".", key)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Schedule> LoadSchedule(const std::string& path,
                                      ScheduleCommandOptions& o) {
  constexpr std::streamsize kMaxFileBytes = 256 << 20;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("--from: cannot read ", path, ": ", std::strerror(errno)));
  }
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), kMaxFileBytes + 1);
  if (in.gcount() > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--from: ", path, " is larger than ", kMaxFileBytes, " bytes"));
  }
  text.resize(in.gcount());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from: ", path, ": ", e.what()));
  }
  RETURN_IF_ERROR(ApplyFileCosts(j, path, o));
  absl::StatusOr<Schedule> s = scheduler::ScheduleFromJson(j);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from: ", path, ": ", s.status().message()));
  }
  if (absl::Status valid = scheduler::ValidateSchedule(*s); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", valid.message()));
  }
  return s;
}

absl::StatusOr<Schedule> GenerateValidated(const ScheduleCommandOptions& o) {
  absl::StatusOr<ScheduleKind> kind = scheduler::ParseScheduleKind(o.kind);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kind: ", kind.status().message()));
  }
  if (o.stages == 0 || o.microbatches == 0) {
    return absl::InvalidArgumentError(
        "--stages and --microbatches are required (or --from FILE)");
  }
  ASSIGN_OR_RETURN(
      Schedule s,
      scheduler::GenerateSchedule(
          *kind,
          {.ranks = o.stages,
           .microbatches = o.microbatches,
           .virtual_stages = o.virtual_stages > 0
                                 ? o.virtual_stages
                                 : scheduler::DefaultVirtualStages(*kind)}));
  // Generators are tested to produce valid schedules; checking again costs
  // little and keeps a generator bug from ever reaching a worker.
  if (absl::Status valid = scheduler::ValidateSchedule(s); !valid.ok()) {
    return absl::InternalError(valid.message());
  }
  return s;
}

bool HasSplitBackward(const Schedule& s) {
  for (const auto& program : s.actions) {
    for (const scheduler::Action& a : program) {
      if (a.op == scheduler::Op::kBackwardInput) return true;
    }
  }
  return false;
}

}  // namespace

CLI::App* AddScheduleCommand(CLI::App& app, ScheduleCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "schedule",
      "Generate, validate and simulate a pipeline schedule, and print it as "
      "text, JSON or an SVG timeline");
  CLI::Option* kind =
      cmd->add_option("--kind", o.kind,
                      absl::StrCat("Schedule: ", scheduler::kScheduleKindNames))
          ->capture_default_str();
  CLI::Option* stages =
      cmd->add_option("--stages,-P", o.stages, "Pipeline ranks (P)");
  CLI::Option* microbatches = cmd->add_option(
      "--microbatches,-M", o.microbatches, "Microbatches per step (M)");
  CLI::Option* virtual_stages =
      cmd->add_option("--virtual,-V", o.virtual_stages,
                      "Virtual stages per rank (V; interleaved-1f1b, "
                      "interleaved-zb, gpipe, looped-bfs; zb-v and "
                      "dualpipev: 2, their default; default 1 otherwise)");
  cmd->add_option("--costs", o.costs,
                  "Per-stage costs F,B or F,BI,BW (default 1,2; 1,1,1 for "
                  "the zb-* kinds). Integers simulate exactly");
  cmd->add_option("--latency", o.latency, "Per-hop latency (default 0)");
  cmd->add_option("--bandwidth", o.bandwidth,
                  "Bytes per time unit on a hop (default 0: free transfers)");
  cmd->add_option("--activation-bytes", o.activation_bytes,
                  "Bytes of one microbatch's activation at a stage boundary "
                  "(default 0)");
  cmd->add_option("--format", o.format, "Output: text, json, svg")
      ->capture_default_str();
  cmd->add_option("--output,-o", o.output,
                  "Write to this file instead of standard output");
  cmd->add_option("--from", o.from,
                  "Validate, simulate and render the schedule in this JSON "
                  "file (the shape --format json prints) instead of "
                  "generating one, with the costs it records unless "
                  "--costs, --latency, --bandwidth or --activation-bytes "
                  "say otherwise")
      ->excludes(kind)
      ->excludes(stages)
      ->excludes(microbatches)
      ->excludes(virtual_stages);
  return cmd;
}

absl::Status RunScheduleCommand(const ScheduleCommandOptions& options,
                                std::ostream& out) {
  ScheduleCommandOptions o = options;
  if (o.format != "text" && o.format != "json" && o.format != "svg") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format: unknown format '", o.format, "'; allowed: text, json, svg"));
  }
  ASSIGN_OR_RETURN(Schedule s, o.from.empty() ? GenerateValidated(o)
                                              : LoadSchedule(o.from, o));
  if (s.TotalActions() > kMaxRenderedActions) {
    return absl::InvalidArgumentError(
        absl::StrCat("the schedule has ", s.TotalActions(),
                     " actions; conveyorctl renders at most ",
                     kMaxRenderedActions, " (fewer ranks or microbatches)"));
  }
  ASSIGN_OR_RETURN(ParsedCosts costs, ParseCosts(o, HasSplitBackward(s)));
  ASSIGN_OR_RETURN(std::string text, costs.AllIntegers()
                                         ? Render<int64_t>(o, s, costs)
                                         : Render<double>(o, s, costs));
  if (o.output.empty()) {
    out << text;
    return absl::OkStatus();
  }
  // FailedPrecondition: retrying will not help until the path is fixed.
  std::ofstream file(o.output, std::ios::binary | std::ios::trunc);
  if (!file) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", o.output, ": ", std::strerror(errno)));
  }
  file << text;
  file.close();
  if (!file) {
    return absl::FailedPreconditionError(
        absl::StrCat("writing ", o.output, " failed (disk full?)"));
  }
  return absl::OkStatus();
}

}  // namespace conveyor::cli
