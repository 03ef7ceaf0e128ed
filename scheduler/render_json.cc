#include "scheduler/render_json.h"

#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace conveyor::scheduler {
namespace {

using nlohmann::json;

// Error paths are built only when something is wrong: a large schedule has
// hundreds of thousands of actions, and formatting "schedule[i].actions[k]"
// for each one up front would cost more than the parse.
template <typename Where>
absl::Status Invalid(const Where& where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where(), ": ", what));
}

// "array", "string \"4\"", "number 2.5": the type, plus the value for scalars
// (shortened) so the reader can find it in the file.
std::string Describe(const json& value) {
  if (value.is_object() || value.is_array() || value.is_null()) {
    return value.type_name();
  }
  constexpr size_t kMaxShown = 40;
  // Replace, not throw, on invalid UTF-8: the message must still come out.
  std::string shown =
      value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (shown.size() > kMaxShown) {
    shown = absl::StrCat(shown.substr(0, kMaxShown), "...");
  }
  return absl::StrCat(value.type_name(), " ", shown);
}

template <typename Where>
absl::StatusOr<const json*> Member(const json& object, const char* key,
                                   const Where& where) {
  auto it = object.find(key);
  if (it == object.end()) return Invalid(where, "missing required key");
  return &*it;
}

// Integers only: 2.0 is rejected rather than truncated, since a count written
// as a float is more likely a mistake than a convenience.
template <typename Where>
absl::StatusOr<int> ReadInt(const json& value, int min, const Where& where) {
  if (!value.is_number_integer()) {
    return Invalid(where,
                   absl::StrCat("expected an integer, got ", Describe(value)));
  }
  int64_t v = 0;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT_MAX)) {
      return Invalid(
          where, absl::StrCat("is ", u, ", too large (at most ", INT_MAX, ")"));
    }
    v = static_cast<int64_t>(u);
  } else {
    v = value.get<int64_t>();
  }
  if (v < min) {
    return Invalid(where, absl::StrCat("must be >= ", min, ", got ", v));
  }
  if (v > INT_MAX) {
    return Invalid(
        where, absl::StrCat("is ", v, ", too large (at most ", INT_MAX, ")"));
  }
  return static_cast<int>(v);
}

template <typename Where>
absl::StatusOr<absl::string_view> ReadString(const json& value,
                                             const Where& where) {
  if (!value.is_string()) {
    return Invalid(where,
                   absl::StrCat("expected a string, got ", Describe(value)));
  }
  return absl::string_view(value.get_ref<const std::string&>());
}

// Key path helpers: "kind", "schedule[2].rank", "schedule[2].actions[7].op".
auto TopKey(const char* key) {
  return [key] { return std::string(key); };
}

absl::StatusOr<Action> ReadAction(const json& value, size_t entry,
                                  size_t index) {
  auto where = [&] {
    return absl::StrCat("schedule[", entry, "].actions[", index, "]");
  };
  auto key_where = [&](const char* key) {
    return [&where, key] { return absl::StrCat(where(), ".", key); };
  };
  if (!value.is_object()) {
    return Invalid(where,
                   absl::StrCat("expected an object, got ", Describe(value)));
  }
  Action action;
  {
    auto op_where = key_where("op");
    ASSIGN_OR_RETURN(const json* op_json, Member(value, "op", op_where));
    ASSIGN_OR_RETURN(absl::string_view name, ReadString(*op_json, op_where));
    absl::StatusOr<Op> op = ParseOp(name);
    if (!op.ok()) return Invalid(op_where, op.status().message());
    action.op = *op;
  }
  {
    auto stage_where = key_where("stage");
    ASSIGN_OR_RETURN(const json* stage, Member(value, "stage", stage_where));
    ASSIGN_OR_RETURN(action.stage, ReadInt(*stage, 0, stage_where));
  }
  {
    auto mb_where = key_where("microbatch");
    ASSIGN_OR_RETURN(const json* mb, Member(value, "microbatch", mb_where));
    ASSIGN_OR_RETURN(action.microbatch, ReadInt(*mb, 0, mb_where));
  }
  return action;
}

absl::StatusOr<Schedule> ScheduleFromJsonImpl(const json& root) {
  if (!root.is_object()) {
    return Invalid([] { return std::string("top level"); },
                   absl::StrCat("expected an object, got ", Describe(root)));
  }
  Schedule schedule;
  {
    ASSIGN_OR_RETURN(const json* kind_json,
                     Member(root, "kind", TopKey("kind")));
    ASSIGN_OR_RETURN(absl::string_view name,
                     ReadString(*kind_json, TopKey("kind")));
    absl::StatusOr<ScheduleKind> kind = ParseScheduleKind(name);
    if (!kind.ok()) return Invalid(TopKey("kind"), kind.status().message());
    schedule.kind = *kind;
    schedule.placement = PlacementOf(*kind);
  }
  if (auto it = root.find("placement"); it != root.end()) {
    ASSIGN_OR_RETURN(absl::string_view name,
                     ReadString(*it, TopKey("placement")));
    absl::StatusOr<Placement> placement = ParsePlacement(name);
    if (!placement.ok()) {
      return Invalid(TopKey("placement"), placement.status().message());
    }
    schedule.placement = *placement;
  }
  // The counts must be positive even though the validator checks the
  // schedule: stage arithmetic (stage mod P) is undefined for P = 0, and the
  // validator should be able to rely on a loaded Schedule being well-formed.
  for (auto [key, field] :
       {std::pair{"ranks", &schedule.ranks},
        std::pair{"virtual", &schedule.virtual_stages},
        std::pair{"microbatches", &schedule.microbatches}}) {
    ASSIGN_OR_RETURN(const json* value, Member(root, key, TopKey(key)));
    ASSIGN_OR_RETURN(*field, ReadInt(*value, 1, TopKey(key)));
  }
  if (static_cast<int64_t>(schedule.ranks) * schedule.virtual_stages >
      INT_MAX) {
    return Invalid(TopKey("virtual"),
                   absl::StrCat("ranks * virtual = ",
                                static_cast<int64_t>(schedule.ranks) *
                                    schedule.virtual_stages,
                                " stages, too many (at most ", INT_MAX, ")"));
  }

  ASSIGN_OR_RETURN(const json* programs,
                   Member(root, "schedule", TopKey("schedule")));
  if (!programs->is_array()) {
    return Invalid(TopKey("schedule"), absl::StrCat("expected an array, got ",
                                                    Describe(*programs)));
  }
  if (programs->size() != static_cast<size_t>(schedule.ranks)) {
    return Invalid(
        TopKey("schedule"),
        absl::StrCat("has ", programs->size(), " entries but ranks is ",
                     schedule.ranks, "; need one entry per rank"));
  }
  schedule.actions.resize(schedule.ranks);
  // Entries may come in any order (their "rank" says whose program it is);
  // seen_at records where each rank was found to report duplicates.
  std::vector<size_t> seen_at(schedule.ranks, SIZE_MAX);
  for (size_t i = 0; i < programs->size(); ++i) {
    const json& entry = (*programs)[i];
    auto where = [i] { return absl::StrCat("schedule[", i, "]"); };
    if (!entry.is_object()) {
      return Invalid(where,
                     absl::StrCat("expected an object, got ", Describe(entry)));
    }
    auto rank_where = [i] { return absl::StrCat("schedule[", i, "].rank"); };
    ASSIGN_OR_RETURN(const json* rank_json, Member(entry, "rank", rank_where));
    ASSIGN_OR_RETURN(int rank, ReadInt(*rank_json, 0, rank_where));
    if (rank >= schedule.ranks) {
      return Invalid(
          rank_where,
          absl::StrCat("is ", rank, " but ranks is ", schedule.ranks,
                       " (valid ranks are 0..", schedule.ranks - 1, ")"));
    }
    if (seen_at[rank] != SIZE_MAX) {
      return Invalid(rank_where, absl::StrCat("rank ", rank,
                                              " already appears in schedule[",
                                              seen_at[rank], "]"));
    }
    seen_at[rank] = i;

    auto actions_where = [i] {
      return absl::StrCat("schedule[", i, "].actions");
    };
    ASSIGN_OR_RETURN(const json* actions,
                     Member(entry, "actions", actions_where));
    if (!actions->is_array()) {
      return Invalid(actions_where, absl::StrCat("expected an array, got ",
                                                 Describe(*actions)));
    }
    std::vector<Action>& out = schedule.actions[rank];
    out.reserve(actions->size());
    for (size_t k = 0; k < actions->size(); ++k) {
      ASSIGN_OR_RETURN(Action action, ReadAction((*actions)[k], i, k));
      out.push_back(action);
    }
  }
  return schedule;
}

}  // namespace

json ScheduleToJson(const Schedule& schedule) {
  json programs = json::array();
  for (size_t r = 0; r < schedule.actions.size(); ++r) {
    json actions = json::array();
    for (const Action& action : schedule.actions[r]) {
      actions.push_back({{"op", std::string(OpName(action.op))},
                         {"stage", action.stage},
                         {"microbatch", action.microbatch}});
    }
    programs.push_back({{"rank", r}, {"actions", std::move(actions)}});
  }
  return {{"kind", std::string(ScheduleKindName(schedule.kind))},
          {"ranks", schedule.ranks},
          {"virtual", schedule.virtual_stages},
          {"microbatches", schedule.microbatches},
          {"placement", std::string(PlacementName(schedule.placement))},
          {"schedule", std::move(programs)}};
}

template <typename T>
json SimulationToJson(const SimulationResult<T>& result) {
  return {{"makespan", result.makespan},
          {"bubble_fraction", result.bubble_fraction()},
          {"peak_inflight", result.peak_inflight},
          {"busy", result.busy},
          {"idle", result.idle},
          {"peak_pending_weight_grads", result.peak_pending_weight_grads}};
}

template json SimulationToJson(const SimulationResult<int64_t>&);
template json SimulationToJson(const SimulationResult<double>&);

absl::StatusOr<Schedule> ScheduleFromJson(const json& root) {
  // Every access above is type-checked first, so nothing should throw; the
  // catch keeps the no-exceptions-across-modules promise if a future edit
  // slips.
  try {
    return ScheduleFromJsonImpl(root);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed schedule JSON: ", e.what()));
  }
}

}  // namespace conveyor::scheduler
