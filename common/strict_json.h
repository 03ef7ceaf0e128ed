// Parsing JSON that comes from outside (a checkpoint manifest, a safetensors
// header) strictly: the checks nlohmann::json leaves out, in one place.
//
// nlohmann::json keeps the last of duplicate keys without a word, so two
// writers' values could hide each other and one of them escape validation;
// it takes a NUL byte for the end of input and ignores what follows; and its
// document depth is bounded only by memory. ParseStrictJson rejects all
// three before the caller's schema checks run.
#ifndef CONVEYOR_COMMON_STRICT_JSON_H_
#define CONVEYOR_COMMON_STRICT_JSON_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace conveyor {

struct StrictJsonOptions {
  // Deepest nesting of arrays and objects accepted; the formats we read are
  // a few levels deep, so a small cap costs nothing and keeps a hostile
  // "[[[[..." far from any recursion in the library.
  int max_depth = 8;
  // What a key of the top-level object is in the duplicate-key error (a
  // safetensors header's keys are tensor names).
  absl::string_view top_level_key = "key";
};

// Parses `text` as one JSON document. `what` names it in errors, which read
// "<what> is not valid JSON: ...", "<what> has duplicate key 'k'" or
// "<what> is nested deeper than N levels" (kInvalidArgument), or
// kResourceExhausted when memory runs out; callers prefix their file name.
absl::StatusOr<nlohmann::json> ParseStrictJson(
    absl::string_view text, absl::string_view what,
    const StrictJsonOptions& options = {});

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_STRICT_JSON_H_
