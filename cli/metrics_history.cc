#include "cli/metrics_history.h"

#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "nlohmann/json.hpp"

namespace conveyor::cli {
namespace {

using Json = nlohmann::json;

// The numeric fields, by name, and where each goes.
struct NumericField {
  const char* name;
  std::optional<double> MetricsPoint::*member;
};
constexpr NumericField kNumericFields[] = {
    {"loss", &MetricsPoint::loss},
    {"learning_rate", &MetricsPoint::learning_rate},
    {"step_seconds", &MetricsPoint::step_seconds},
    {"samples_per_second", &MetricsPoint::samples_per_second},
    {"tokens_per_second", &MetricsPoint::tokens_per_second},
    {"bubble_fraction", &MetricsPoint::bubble_fraction},
    {"eval_loss", &MetricsPoint::eval_loss},
    {"eval_perplexity", &MetricsPoint::eval_perplexity},
    {"grad_norm", &MetricsPoint::grad_norm},
    {"receive_wait_fraction", &MetricsPoint::receive_wait_fraction},
    {"mfu", &MetricsPoint::mfu},
    {"peak_memory_allocated_bytes", &MetricsPoint::peak_memory_allocated_bytes},
    {"peak_memory_reserved_bytes", &MetricsPoint::peak_memory_reserved_bytes},
};

std::string TypeName(const Json& value) { return value.type_name(); }

// An integer field: a JSON integer, or a float with an integral value (a
// file that went through pandas may have "12.0").
absl::StatusOr<int64_t> IntegerField(const Json& value, absl::string_view name,
                                     int64_t min) {
  int64_t v = 0;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", name, "\" is out of range: ", u));
    }
    v = static_cast<int64_t>(u);
  } else if (value.is_number_integer()) {
    v = value.get<int64_t>();
  } else if (value.is_number_float()) {
    const double d = value.get<double>();
    // 2^63 is exactly representable; anything at or past it is not an int64.
    if (!(std::isfinite(d) && d == std::floor(d) && std::abs(d) < 0x1p63)) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", name, "\" must be an integer; got ", d));
    }
    v = static_cast<int64_t>(d);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", name, "\" must be an integer; got ", TypeName(value)));
  }
  if (v < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", name, "\" must be >= ", min, "; got ", v));
  }
  return v;
}

// One line into a point, or why not (without the file:line prefix).
absl::StatusOr<MetricsPoint> ParseLine(absl::string_view line) {
  ASSIGN_OR_RETURN(Json j, ParseStrictJson(line, "the line"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a JSON object; got ", TypeName(j)));
  }
  MetricsPoint point;
  auto step = j.find("step");
  if (step == j.end()) {
    return absl::InvalidArgumentError("\"step\" is missing");
  }
  ASSIGN_OR_RETURN(point.step, IntegerField(*step, "step", 0));
  if (auto it = j.find("restarts"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(point.restarts, IntegerField(*it, "restarts", 0));
  }
  if (auto it = j.find("time_unix_ms"); it != j.end() && !it->is_null()) {
    RETURN_IF_ERROR(IntegerField(*it, "time_unix_ms", 0).status());
  }
  for (const NumericField& field : kNumericFields) {
    auto it = j.find(field.name);
    // Absent and null are the same: nlohmann-json writes NaN and infinities
    // (a diverged loss) as null.
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", field.name, "\" must be a number or null; got ",
                       TypeName(*it)));
    }
    const double v = it->get<double>();
    // A number too large for a double parses as infinity: no point to draw.
    if (std::isfinite(v)) point.*field.member = v;
  }
  return point;
}

}  // namespace

absl::StatusOr<MetricsHistory> ParseMetricsHistory(absl::string_view text,
                                                   absl::string_view path) {
  MetricsHistory history;
  // By step, the last line wins: the coordinator appends a step again when
  // the job runs it again after a restart.
  std::map<int64_t, MetricsPoint> by_step;
  int64_t line_number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    ++line_number;
    const size_t newline = text.find('\n', pos);
    const bool complete = newline != absl::string_view::npos;
    const absl::string_view line =
        text.substr(pos, complete ? newline - pos : absl::string_view::npos);
    pos = complete ? newline + 1 : text.size();
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<MetricsPoint> point = ParseLine(line);
    if (!point.ok()) {
      // The coordinator writes each line, newline included, with one
      // write(); a last line without its newline that does not parse is
      // one it was killed in the middle of.
      if (!complete) {
        history.warnings.push_back(absl::StrCat(
            path, ":", line_number,
            ": skipped the last line, which is incomplete (no newline; ",
            point.status().message(), ")"));
        break;
      }
      return absl::Status(
          point.status().code(),
          absl::StrCat(path, ":", line_number, ": ", point.status().message()));
    }
    point->line = line_number;
    history.max_restarts = std::max(history.max_restarts, point->restarts);
    auto [it, inserted] = by_step.try_emplace(point->step, *point);
    if (!inserted) {
      it->second = *std::move(point);
      ++history.superseded_lines;
    }
  }
  if (by_step.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": no steps",
        text.empty() ? " (the file is empty: the job has not completed a "
                       "step yet)"
                     : ""));
  }
  history.points.reserve(by_step.size());
  for (auto& [step, point] : by_step) {
    history.points.push_back(std::move(point));
  }
  return history;
}

absl::StatusOr<MetricsHistory> ReadMetricsHistory(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxMetricsHistoryBytes));
  return ParseMetricsHistory(text, path);
}

}  // namespace conveyor::cli
