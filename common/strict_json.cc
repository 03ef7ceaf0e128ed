#include "common/strict_json.h"

#include <exception>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace conveyor {
namespace {

using Json = nlohmann::json;

// The deepest nesting of [ and { outside strings exceeds `max_depth`.
// Counted before parsing, so the library never builds the deep document.
bool TooDeep(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// A key as it may appear in an error: printable and short.
std::string Printable(const std::string& key) {
  constexpr size_t kMaxShown = 64;
  std::string shown = absl::CHexEscape(key.substr(0, kMaxShown));
  if (key.size() > kMaxShown) shown += "...";
  return shown;
}

}  // namespace

absl::StatusOr<Json> ParseStrictJson(absl::string_view text,
                                     absl::string_view what,
                                     const StrictJsonOptions& options) {
  // A raw NUL is never valid JSON (inside strings it must be escaped).
  if (const size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid JSON: NUL byte at offset ", nul));
  }
  if (TooDeep(text, options.max_depth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is nested deeper than ", options.max_depth, " levels"));
  }
  // Every open object's keys; the first repeat fails the parse.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  int duplicate_depth = 0;
  Json::parser_callback_t callback = [&](int depth, Json::parse_event_t event,
                                         Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (duplicate.empty() && !open_objects.empty() && parsed.is_string()) {
          const auto& key = parsed.get_ref<const std::string&>();
          if (!open_objects.back().insert(key).second) {
            duplicate = key;
            duplicate_depth = depth;
          }
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json json;
  try {
    json = Json::parse(text.begin(), text.end(), callback,
                       /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid JSON: ", e.what()));
  } catch (const std::exception& e) {
    // std::bad_alloc from the key sets or the document.
    return absl::ResourceExhaustedError(
        absl::StrCat("parsing ", what, ": ", e.what()));
  }
  if (!duplicate.empty()) {
    // Depth 1 is the top-level object.
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has duplicate ",
                     duplicate_depth == 1 ? options.top_level_key : "key", " '",
                     Printable(duplicate), "'"));
  }
  return json;
}

}  // namespace conveyor
