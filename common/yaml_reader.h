// YamlReader: strict reading of untrusted YAML configuration (job files, the
// model spec) into typed values, where every problem is an InvalidArgument of
// the form
//
//   job.yaml:7:9: optimizer.lr: must be a non-negative number; got 'fast'
//
// (1-based line and column, the YAML path, the message), never an exception:
// yaml-cpp reports errors by throwing, so every call that can throw is either
// avoided (no as<T>(), no operator[] on a const map) or caught here.
//
// Strict means: maps reject unknown and duplicate keys (yaml-cpp 0.7 keeps
// both copies of a duplicate and `[]` returns the first, so a duplicate would
// otherwise be silently ignored), numbers must be plain scalars (a quoted "3"
// is a string), and booleans follow YAML 1.2 (true/false only).
//
//   YamlReader reader("job.yaml");
//   ASSIGN_OR_RETURN(YAML::Node doc, LoadYaml(text, "job.yaml",
//                                             YamlDocuments::kExactlyOne));
//   ASSIGN_OR_RETURN(YamlMap top, reader.ReadMap(reader.Root(doc),
//                                                {"name", "training"}));
//   ASSIGN_OR_RETURN(const YamlMapEntry* training,
//                    reader.Require(top, "training"));
//   ASSIGN_OR_RETURN(YamlMap t, reader.ReadMap(training->value, {"steps"}));
//   if (const YamlMapEntry* steps = t.Find("steps"); steps != nullptr) {
//     ASSIGN_OR_RETURN(int64_t n, reader.ParseInt(steps->value, 1, kMax));
//   }
//
// Thread-safety: a YamlReader holds only the file name and is immutable, so
// it may be shared; but yaml-cpp updates internal caches even through a const
// YAML::Node, so threads must not read one node tree concurrently. The free
// functions keep no state.
#ifndef CONVEYOR_COMMON_YAML_READER_H_
#define CONVEYOR_COMMON_YAML_READER_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "yaml-cpp/yaml.h"

namespace conveyor {

// Where a YAML node was, for errors reported during or after parsing. line
// and column are 1-based; 0 when unknown (a node built in code rather than
// parsed).
struct SourceLocation {
  std::string file;
  int line = 0;
  int column = 0;

  // "file:line:col", or "file" when the position is unknown.
  std::string ToString() const;
};

// A YAML node with the path ("optimizer.betas[1]") and position its errors
// report. The empty path is the document's top level. For a null map value
// (`lr:` with nothing after it) or a null list item, yaml-cpp marks the next
// token, so readers give such a value its key's or its list's position.
struct YamlValue {
  YAML::Node node;
  std::string path;
  SourceLocation where;
};

struct YamlMapEntry {
  std::string key;
  YamlValue value;
  SourceLocation key_where;
};

// A map read by YamlReader: its entries in document order (keys unique), and
// the map itself for errors about missing keys.
struct YamlMap {
  YamlValue self;
  std::vector<YamlMapEntry> entries;

  // The entry for `key`, or nullptr.
  const YamlMapEntry* Find(absl::string_view key) const;
};

// Allowed keys or enum names. A braced list of string literals converts to it
// for the duration of a call.
using YamlNames = absl::Span<const absl::string_view>;

// How a node looks in an error message: "'abc'", "the quoted string \"3\"",
// "a list", "a map", "null", "nothing" (an undefined node).
std::string DescribeYaml(const YAML::Node& node);

// InvalidArgument "where: path: message"; an empty path reads "(top level)".
absl::Status YamlError(const SourceLocation& where, absl::string_view path,
                       absl::string_view message);

// OK when `text` is well-formed UTF-8; otherwise InvalidArgument
// "file:line:col: not UTF-8 text (byte 0xff); ..." at the first bad byte
// (columns count bytes). LoadYaml checks it first: yaml-cpp would take other
// bytes as they come, and job text travels in protobuf strings, which must
// be UTF-8 (a stray byte once failed a submission with an empty message).
absl::Status CheckUtf8Text(absl::string_view text, absl::string_view file);

// How many documents LoadYaml accepts in one text.
enum class YamlDocuments {
  // The first document; later ones are neither parsed nor checked (like
  // YAML::Load).
  kFirst,
  // Exactly one (or none: an empty text); a second document is an error, so
  // that two files pasted together cannot silently lose the second.
  kExactlyOne,
};

// Parses `text`. An empty text gives a null node. Returns InvalidArgument
// "file:line:col: YAML syntax error: ..." for malformed YAML (or "YAML error"
// for other yaml-cpp failures), and for a second document under kExactlyOne;
// Internal for an unexpected exception (std::bad_alloc).
absl::StatusOr<YAML::Node> LoadYaml(absl::string_view text,
                                    absl::string_view file,
                                    YamlDocuments documents);

// Runs `parse` (returning absl::StatusOr<T> or absl::Status) and turns any
// exception that escapes it into a Status: a YAML::Exception into
// InvalidArgument "file[:line:col]: YAML error: ...", anything else into
// Internal "file: unexpected error parsing <what>: ...". A backstop at a
// module boundary; readers below never throw on purpose.
template <typename F>
auto CatchYamlExceptions(absl::string_view file, absl::string_view what,
                         F&& parse) -> decltype(parse());

// Reads values of one file. Every method returns InvalidArgument
// "file:line:col: path: message" for input it cannot accept; none throws.
class YamlReader {
 public:
  explicit YamlReader(absl::string_view file) : file_(file) {}

  const std::string& file() const { return file_; }

  // The position of `node`: line and column 0 when it has none.
  SourceLocation Loc(const YAML::Node& node) const;

  // `doc` as the top level (empty path); positioned at 1:1 when the node has
  // no position (an empty document).
  YamlValue Root(const YAML::Node& doc) const;

  // Item `i` of the list `list` (which must be a sequence with more than `i`
  // items), with path "list.path[i]"; a null item takes the list's position.
  YamlValue Element(const YamlValue& list, size_t i) const;

  // The entries of a map, after rejecting non-scalar keys and duplicate keys.
  // A null node reads as an empty map when `null_is_empty` (`dense:` with no
  // options), else it is an error like any non-map.
  absl::StatusOr<YamlMap> ReadAnyMap(const YamlValue& value,
                                     bool null_is_empty = false) const;
  // ReadAnyMap, then CheckKeys(map, allowed).
  absl::StatusOr<YamlMap> ReadMap(const YamlValue& value, YamlNames allowed,
                                  bool null_is_empty = false) const;
  // Rejects the first key of `map` not in `allowed`, at the key's position:
  // "unknown key 'x'; allowed: a, b" ("...; this takes no options" when
  // `allowed` is empty).
  absl::Status CheckKeys(const YamlMap& map, YamlNames allowed) const;
  // The first entry of `map` whose key is not in `allowed`, or nullptr; for
  // callers that word the error themselves.
  static const YamlMapEntry* FirstUnknownKey(const YamlMap& map,
                                             YamlNames allowed);
  // The entry for `key`, or "missing required key 'key'" at the map.
  absl::StatusOr<const YamlMapEntry*> Require(const YamlMap& map,
                                              absl::string_view key) const;

  // An integer in [min, max] written as an optionally signed run of decimal
  // digits (no hex, no "1e3", no quotes). The message says "must be a
  // positive integer" for min 1, "must be a non-negative integer" for min 0,
  // else "must be an integer in [min, max]"; above max, "must be at most
  // max".
  absl::StatusOr<int64_t> ParseInt(const YamlValue& value, int64_t min,
                                   int64_t max) const;
  // A non-negative integer up to 2^64 - 1 (seeds).
  absl::StatusOr<uint64_t> ParseUint64(const YamlValue& value) const;
  // true/True/TRUE or false/False/FALSE (YAML 1.2's core schema: yaml-cpp
  // would also take yes/no/on/off, which YAML 1.2 reads as strings, so
  // accepting them would make the same file mean different things to
  // different tools).
  absl::StatusOr<bool> ParseBool(const YamlValue& value) const;
  // A finite number: decimal or exponent notation ("0.5", "1e-3",
  // "1.0e-8"); not .inf, .nan or a quoted string.
  absl::StatusOr<double> ParseNumber(const YamlValue& value) const;
  // ParseNumber, and > 0.
  absl::StatusOr<double> ParsePositiveDouble(const YamlValue& value) const;
  // ParseNumber, and >= 0.
  absl::StatusOr<double> ParseNonNegativeDouble(const YamlValue& value) const;
  // The index in `allowed` of the value, a scalar equal to one of the names:
  // otherwise "must be one of: a, b; got ...".
  absl::StatusOr<int> ParseEnum(const YamlValue& value,
                                YamlNames allowed) const;
  // A non-empty scalar, quoted or not (`name: 123` is the string "123").
  absl::StatusOr<std::string> ParseString(const YamlValue& value) const;

  // YamlError(value.where, value.path, message).
  absl::Status Error(const YamlValue& value, absl::string_view message) const {
    return YamlError(value.where, value.path, message);
  }

 private:
  std::string file_;
};

// Implementation details below.

template <typename F>
auto CatchYamlExceptions(absl::string_view file, absl::string_view what,
                         F&& parse) -> decltype(parse()) {
  try {
    return std::forward<F>(parse)();
  } catch (const YAML::Exception& e) {
    SourceLocation where{std::string(file), 0, 0};
    if (!e.mark.is_null()) {
      where.line = e.mark.line + 1;
      where.column = e.mark.column + 1;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(where.ToString(), ": YAML error: ", e.msg));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(file, ": unexpected error parsing ",
                                            what, ": ", e.what()));
  }
}

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_YAML_READER_H_
