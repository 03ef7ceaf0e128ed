// `--set key.path=value` overrides of a job's YAML, applied before the job is
// parsed locally or sent to the coordinator:
//
//   conveyorctl submit job.yaml --set training.steps=500
//       --set optimizer.betas=[0.9,0.95] --set model.layers.0.dense.features=64
//
// The path walks maps by key (creating maps where a key is missing or null)
// and lists by 0-based index; the value is parsed as YAML, so numbers, bools,
// lists and maps keep their types ("--set name='\"007\"'" sets a string). The
// document is then emitted again: comments and the original layout are gone,
// so error positions refer to the emitted text, which the caller labels
// ("job.yaml (with --set)").
//
// Errors are InvalidArgument naming the flag: "--set needs key.path=value;
// got 'steps'", "--set training.steps.x=1: training.steps is a scalar, not a
// map", a value that is not YAML, or a job file that is not.
// Thread-safe (pure functions).
#ifndef CONVEYOR_CLI_OVERRIDES_H_
#define CONVEYOR_CLI_OVERRIDES_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::cli {

struct Override {
  std::vector<std::string> path;  // "a.b.0" -> {"a", "b", "0"}
  std::string value;              // YAML text, possibly empty (null).
  std::string spec;               // As given, for error messages.
};

// Splits "key.path=value" at the first '='. InvalidArgument for a missing
// '=' or an empty key or path component.
absl::StatusOr<Override> ParseOverride(absl::string_view spec);

// Sets the node at `override.path` in `doc` (a map, or null for an empty
// document) to the parsed value, creating maps on the way. InvalidArgument
// when the path crosses a scalar, a list index is not a number in range, or
// the value is not one YAML document.
absl::Status ApplyOverride(const Override& override, YAML::Node& doc);

// The YAML text of `doc`. Quoted scalars stay quoted and flow collections
// stay flow, so the result parses to the same values under the strict job
// reader (which reads a quoted "3" as a string). InvalidArgument for a
// document nested deeper than 64 levels or larger than `max_bytes` once
// emitted (aliases are expanded, so a small file can emit a huge one); the
// error starts "source:line:col: " at the node that crossed the limit when
// `source` names the text `doc` was parsed from.
absl::StatusOr<std::string> EmitYaml(const YAML::Node& doc, size_t max_bytes,
                                     absl::string_view source = "");

// More specs, derived from the document once `specs` are applied (--steps:
// cli/job_file.h StepsOverrides), so that the text is loaded once.
using DeriveOverrides =
    std::function<std::vector<std::string>(const YAML::Node& doc)>;

// Parses `yaml` (errors at "file_name:line:col"), applies each `--set` spec
// in order, then those `derive` returns, and emits the result (at most
// `max_bytes`). With no specs and no `derive`, returns `yaml` unchanged, so
// positions in errors stay those of the file.
absl::StatusOr<std::string> ApplyOverrides(absl::string_view yaml,
                                           absl::string_view file_name,
                                           absl::Span<const std::string> specs,
                                           size_t max_bytes,
                                           const DeriveOverrides& derive = {});

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_OVERRIDES_H_
