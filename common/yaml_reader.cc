#include "common/yaml_reader.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/yaml_load_count.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace conveyor {
namespace {

// A scalar that was not quoted: the "!" tag marks a quoted scalar, which is a
// string even when it looks like a number.
bool IsPlainScalar(const YAML::Node& node) {
  return node.IsScalar() && node.Tag() != "!";
}

// An optionally signed run of decimal digits. Stricter than absl::SimpleAtoi,
// which also takes surrounding whitespace and hex prefixes.
bool IsDecimalInteger(absl::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

SourceLocation MarkLocation(absl::string_view file, const YAML::Mark& mark) {
  SourceLocation where{std::string(file), 0, 0};
  if (mark.is_null()) return where;
  where.line = mark.line + 1;
  where.column = mark.column + 1;
  return where;
}

// Records where the last document started; ignores everything else.
class DocumentStarts : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { start = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  YAML::Mark start;
};

// yaml-cpp 0.7's LoadAll never returns for some invalid texts, such as ","
// (found by fuzz/job_spec_fuzzer): at a top-level ',' the parser reports an
// empty document without consuming the token, and LoadAll asks for the next
// document forever, allocating a node each time until memory runs out
// (jbeder/yaml-cpp#1040, fixed upstream after 0.8.0 by #1319). This walks
// the documents without building nodes and returns where a document starts
// at the same place as the one before, i.e. where the parser is stuck.
// Throws what the parser throws.
std::optional<YAML::Mark> StuckDocument(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  std::optional<YAML::Mark> previous;
  while (parser.HandleNextDocument(starts)) {
    if (previous.has_value() && previous->pos == starts.start.pos) {
      return starts.start;
    }
    previous = starts.start;
  }
  return std::nullopt;
}

}  // namespace

std::string SourceLocation::ToString() const {
  if (line <= 0) return file;
  return absl::StrCat(file, ":", line, ":", column);
}

const YamlMapEntry* YamlMap::Find(absl::string_view key) const {
  for (const YamlMapEntry& entry : entries) {
    if (entry.key == key) return &entry;
  }
  return nullptr;
}

std::string DescribeYaml(const YAML::Node& node) {
  // An invalid node (a missing key looked up in a const map) throws from
  // Type(); IsDefined() is the one query that is safe on it.
  if (!node.IsDefined()) return "nothing";
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      break;
  }
  // A quoted number is the most confusing case, so say so.
  if (node.Tag() == "!")
    return absl::StrCat("the quoted string \"", node.Scalar(), "\"");
  return absl::StrCat("'", node.Scalar(), "'");
}

absl::Status YamlError(const SourceLocation& where, absl::string_view path,
                       absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(where.ToString(), ": ", path.empty() ? "(top level)" : path,
                   ": ", message));
}

namespace {

// The offset of the first byte of `text` that is not well-formed UTF-8
// (overlong forms, surrogates and code points past U+10FFFF included), if
// any.
std::optional<size_t> FirstInvalidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    int more = 0;
    uint32_t min = 0, cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      more = 1, min = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      more = 2, min = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      more = 3, min = 0x10000, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + more >= text.size()) return i;  // Cut short by the end.
    for (int k = 1; k <= more; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (next & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += more + 1;
  }
  return std::nullopt;
}

}  // namespace

absl::Status CheckUtf8Text(absl::string_view text, absl::string_view file) {
  const std::optional<size_t> bad = FirstInvalidUtf8(text);
  if (!bad.has_value()) return absl::OkStatus();
  const absl::string_view before = text.substr(0, *bad);
  const size_t line_start = before.rfind('\n');
  const int line =
      1 + static_cast<int>(std::count(before.begin(), before.end(), '\n'));
  const int column = static_cast<int>(
      *bad - (line_start == absl::string_view::npos ? 0 : line_start + 1) + 1);
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: not UTF-8 text (byte 0x%02x); save the file as UTF-8",
      SourceLocation{std::string(file), line, column}.ToString(),
      static_cast<unsigned char>(text[*bad])));
}

namespace {

// TEST_CountYamlLoads's counts, by the text's hash; kept only while on.
std::mutex load_count_mu;
bool counting_loads = false;
std::map<size_t, int64_t> load_counts;

size_t TextKey(absl::string_view text) {
  return std::hash<std::string_view>()(
      std::string_view(text.data(), text.size()));
}

void CountLoad(absl::string_view text) {
  std::lock_guard<std::mutex> lock(load_count_mu);
  if (counting_loads) ++load_counts[TextKey(text)];
}

}  // namespace

void TEST_CountYamlLoads(bool on) {
  std::lock_guard<std::mutex> lock(load_count_mu);
  counting_loads = on;
  load_counts.clear();
}

int64_t TEST_YamlLoadsOf(absl::string_view text) {
  std::lock_guard<std::mutex> lock(load_count_mu);
  auto it = load_counts.find(TextKey(text));
  return it == load_counts.end() ? 0 : it->second;
}

absl::StatusOr<YAML::Node> LoadYaml(absl::string_view text,
                                    absl::string_view file,
                                    YamlDocuments documents) {
  CountLoad(text);
  if (absl::Status s = CheckUtf8Text(text, file); !s.ok()) return s;
  return CatchYamlExceptions(file, "YAML", [&]() -> absl::StatusOr<YAML::Node> {
    try {
      if (documents == YamlDocuments::kFirst) {
        return YAML::Load(std::string(text));
      }
      const std::string owned(text);
      if (const std::optional<YAML::Mark> stuck = StuckDocument(owned)) {
        return absl::InvalidArgumentError(
            absl::StrCat(MarkLocation(file, *stuck).ToString(),
                         ": YAML syntax error: unexpected token at the top "
                         "level"));
      }
      std::vector<YAML::Node> docs = YAML::LoadAll(owned);
      if (docs.empty()) return YAML::Node(YAML::NodeType::Null);
      if (docs.size() > 1) {
        SourceLocation where = MarkLocation(file, docs[1].Mark());
        if (where.line == 0) where = {std::string(file), 1, 1};
        return absl::InvalidArgumentError(absl::StrCat(
            where.ToString(), ": expected one YAML document; found ",
            docs.size(), " (separated by '---')"));
      }
      return docs[0];
    } catch (const YAML::ParserException& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ":", e.mark.line + 1, ":", e.mark.column + 1,
                       ": YAML syntax error: ", e.msg));
    }
  });
}

SourceLocation YamlReader::Loc(const YAML::Node& node) const {
  if (!node.IsDefined()) return SourceLocation{file_, 0, 0};
  return MarkLocation(file_, node.Mark());
}

YamlValue YamlReader::Root(const YAML::Node& doc) const {
  SourceLocation where = Loc(doc);
  if (where.line == 0) where = {file_, 1, 1};
  return YamlValue{doc, "", std::move(where)};
}

YamlValue YamlReader::Element(const YamlValue& list, size_t i) const {
  const YAML::Node item = list.node[i];
  SourceLocation where = item.IsNull() ? list.where : Loc(item);
  if (where.line == 0) where = list.where;
  return YamlValue{item, absl::StrCat(list.path, "[", i, "]"),
                   std::move(where)};
}

absl::StatusOr<YamlMap> YamlReader::ReadAnyMap(const YamlValue& value,
                                               bool null_is_empty) const {
  YamlMap map{value, {}};
  if (value.node.IsNull() && null_is_empty) return map;
  if (!value.node.IsMap()) {
    return Error(value,
                 absl::StrCat("must be a map; got ", DescribeYaml(value.node)));
  }
  // Copies, not references: yaml-cpp's map iterators hand out a temporary
  // proxy, and a reference to its members dangles after the statement.
  for (auto it = value.node.begin(); it != value.node.end(); ++it) {
    const YAML::Node key_node = it->first;
    const SourceLocation key_where = Loc(key_node);
    if (!key_node.IsScalar()) {
      return YamlError(
          key_where, value.path,
          absl::StrCat("keys must be strings; got ", DescribeYaml(key_node)));
    }
    const std::string& key = key_node.Scalar();
    if (map.Find(key) != nullptr) {
      return YamlError(key_where, value.path,
                       absl::StrCat("duplicate key '", key, "'"));
    }
    const YAML::Node child = it->second;
    std::string path =
        value.path.empty() ? key : absl::StrCat(value.path, ".", key);
    map.entries.push_back(
        YamlMapEntry{key,
                     YamlValue{child, std::move(path),
                               child.IsNull() ? key_where : Loc(child)},
                     key_where});
  }
  return map;
}

absl::StatusOr<YamlMap> YamlReader::ReadMap(const YamlValue& value,
                                            YamlNames allowed,
                                            bool null_is_empty) const {
  absl::StatusOr<YamlMap> map = ReadAnyMap(value, null_is_empty);
  if (!map.ok()) return map;
  if (absl::Status s = CheckKeys(*map, allowed); !s.ok()) return s;
  return map;
}

const YamlMapEntry* YamlReader::FirstUnknownKey(const YamlMap& map,
                                                YamlNames allowed) {
  for (const YamlMapEntry& entry : map.entries) {
    if (std::find(allowed.begin(), allowed.end(), entry.key) == allowed.end()) {
      return &entry;
    }
  }
  return nullptr;
}

absl::Status YamlReader::CheckKeys(const YamlMap& map,
                                   YamlNames allowed) const {
  const YamlMapEntry* entry = FirstUnknownKey(map, allowed);
  if (entry == nullptr) return absl::OkStatus();
  return YamlError(
      entry->key_where, map.self.path,
      allowed.empty()
          ? absl::StrCat("unknown key '", entry->key,
                         "'; this takes no options")
          : absl::StrCat("unknown key '", entry->key,
                         "'; allowed: ", absl::StrJoin(allowed, ", ")));
}

absl::StatusOr<const YamlMapEntry*> YamlReader::Require(
    const YamlMap& map, absl::string_view key) const {
  const YamlMapEntry* entry = map.Find(key);
  if (entry == nullptr) {
    return Error(map.self, absl::StrCat("missing required key '", key, "'"));
  }
  return entry;
}

absl::StatusOr<int64_t> YamlReader::ParseInt(const YamlValue& value,
                                             int64_t min, int64_t max) const {
  const std::string expected =
      min == 1   ? std::string("must be a positive integer")
      : min == 0 ? std::string("must be a non-negative integer")
                 : absl::StrCat("must be an integer in [", min, ", ", max, "]");
  if (!IsPlainScalar(value.node) || !IsDecimalInteger(value.node.Scalar())) {
    return Error(value,
                 absl::StrCat(expected, "; got ", DescribeYaml(value.node)));
  }
  const std::string& text = value.node.Scalar();
  int64_t n = 0;
  // Digits that do not fit int64 are out of range on one side or the other.
  const bool fits = absl::SimpleAtoi(text, &n);
  if ((!fits && text[0] == '-') || (fits && n < min)) {
    return Error(value,
                 absl::StrCat(expected, "; got ", DescribeYaml(value.node)));
  }
  if (!fits || n > max) {
    return Error(value, absl::StrCat("must be at most ", max, "; got ", text));
  }
  return n;
}

absl::StatusOr<uint64_t> YamlReader::ParseUint64(const YamlValue& value) const {
  const YAML::Node& node = value.node;
  const bool digits = IsPlainScalar(node) && IsDecimalInteger(node.Scalar()) &&
                      node.Scalar()[0] != '-';
  if (!digits) {
    return Error(value, absl::StrCat("must be a non-negative integer; got ",
                                     DescribeYaml(node)));
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(node.Scalar(), &n)) {
    return Error(value,
                 absl::StrCat("must be at most 2^64 - 1; got ", node.Scalar()));
  }
  return n;
}

absl::StatusOr<bool> YamlReader::ParseBool(const YamlValue& value) const {
  if (IsPlainScalar(value.node)) {
    const std::string& s = value.node.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
  }
  return Error(value, absl::StrCat("must be true or false; got ",
                                   DescribeYaml(value.node)));
}

absl::StatusOr<double> YamlReader::ParseNumber(const YamlValue& value) const {
  double d = 0;
  // SimpleAtod takes decimal and exponent forms; it maps overflow to ±inf and
  // takes "inf"/"nan", which isfinite rejects.
  if (IsPlainScalar(value.node) && absl::SimpleAtod(value.node.Scalar(), &d) &&
      std::isfinite(d)) {
    return d;
  }
  return Error(
      value, absl::StrCat("must be a number; got ", DescribeYaml(value.node)));
}

absl::StatusOr<double> YamlReader::ParsePositiveDouble(
    const YamlValue& value) const {
  absl::StatusOr<double> d = ParseNumber(value);
  if (d.ok() && *d > 0) return d;
  return Error(value, absl::StrCat("must be a positive number; got ",
                                   DescribeYaml(value.node)));
}

absl::StatusOr<double> YamlReader::ParseNonNegativeDouble(
    const YamlValue& value) const {
  absl::StatusOr<double> d = ParseNumber(value);
  // -0 passes `>= 0`; normalize it so it prints and compares as 0.
  if (d.ok() && *d >= 0) return *d + 0.0;
  return Error(value, absl::StrCat("must be a non-negative number; got ",
                                   DescribeYaml(value.node)));
}

absl::StatusOr<int> YamlReader::ParseEnum(const YamlValue& value,
                                          YamlNames allowed) const {
  if (value.node.IsScalar()) {
    int i = 0;
    for (absl::string_view a : allowed) {
      if (value.node.Scalar() == a) return i;
      ++i;
    }
  }
  return Error(value,
               absl::StrCat("must be one of: ", absl::StrJoin(allowed, ", "),
                            "; got ", DescribeYaml(value.node)));
}

absl::StatusOr<std::string> YamlReader::ParseString(
    const YamlValue& value) const {
  if (value.node.IsScalar() && !value.node.Scalar().empty()) {
    return value.node.Scalar();
  }
  return Error(value, absl::StrCat("must be a non-empty string; got ",
                                   DescribeYaml(value.node)));
}

}  // namespace conveyor
