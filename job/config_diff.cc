#include "job/config_diff.h"

#include <algorithm>
#include <exception>
#include <initializer_list>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/yaml_path.h"
#include "common/yaml_reader.h"
#include "job/config_scope.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job {
namespace {

using Kind = ConfigDifference::Kind;

// Both bounds keep a file whose aliases expand to a huge (or, with a
// self-reference, endless) tree from making the comparison run away;
// JobConfigHash bounds its canonical text the same way.
constexpr int kMaxDepth = 64;
constexpr int64_t kMaxVisits = int64_t{1} << 20;

// The hash writes Null and Undefined alike.
YAML::NodeType::value TypeOf(const YAML::Node& node) {
  return node.Type() == YAML::NodeType::Undefined ? YAML::NodeType::Null
                                                  : node.Type();
}

bool NeedsQuotes(absl::string_view text) {
  if (text.empty() || text.front() == ' ' || text.back() == ' ') return true;
  return std::any_of(text.begin(), text.end(), [](char c) {
    return absl::string_view(",:[]{}#\"'").find(c) != absl::string_view::npos ||
           static_cast<unsigned char>(c) < 0x20;
  });
}

// Appends `node` in flow style to `out`; false once `out` is over `limit`
// characters (the rest is not written).
bool RenderFlow(const YAML::Node& node, size_t limit, int depth,
                std::string& out) {
  if (out.size() > limit || depth > kMaxDepth) return false;
  switch (TypeOf(node)) {
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (NeedsQuotes(text)) {
        absl::StrAppend(&out, "\"", absl::CHexEscape(text), "\"");
      } else {
        out += text;
      }
      break;
    }
    case YAML::NodeType::Sequence: {
      out += "[";
      bool first = true;
      for (const YAML::Node& item : node) {
        if (!first) out += ", ";
        first = false;
        if (!RenderFlow(item, limit, depth + 1, out)) return false;
      }
      out += "]";
      break;
    }
    case YAML::NodeType::Map: {
      out += "{";
      bool first = true;
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        if (!RenderFlow(it->first, limit, depth + 1, out)) return false;
        out += ": ";
        if (!RenderFlow(it->second, limit, depth + 1, out)) return false;
      }
      out += "}";
      break;
    }
    default:
      out += "null";
      break;
  }
  return out.size() <= limit;
}

// The value as shown in a message: itself when short, else what it is.
std::string ShowValue(const YAML::Node& node) {
  std::string text;
  if (RenderFlow(node, kMaxShownValueChars, 0, text)) return text;
  const size_t n = node.size();
  switch (TypeOf(node)) {
    case YAML::NodeType::Sequence:
      return absl::StrCat("a list of ", n, n == 1 ? " item" : " items");
    case YAML::NodeType::Map:
      return absl::StrCat("a map of ", n, n == 1 ? " key" : " keys");
    default:
      return absl::StrCat("a ", node.Scalar().size(), "-character text");
  }
}

// How a map key is matched and named: a scalar by its text, anything else
// (which no job file the parser accepts has) by its flow rendering.
std::string KeyText(const YAML::Node& key) {
  if (key.IsScalar()) return key.Scalar();
  std::string text;
  RenderFlow(key, 256, 0, text);
  return text;
}

class Differ {
 public:
  explicit Differ(ConfigScope scope) : scope_(scope) {}

  // `top_level`: a and b are the documents; `in_model`: they are in the
  // top-level model section.
  void Compare(const YAML::Node& a, const YAML::Node& b,
               const std::string& path, int depth, bool top_level,
               bool in_model, bool list_item) {
    if (!Visit(depth)) return;
    const YAML::NodeType::value type = TypeOf(a);
    if (type != TypeOf(b) ||
        (type == YAML::NodeType::Scalar && a.Scalar() != b.Scalar())) {
      Add(Kind::kChanged, path, &a, &b, list_item);
      return;
    }
    if (type == YAML::NodeType::Sequence) {
      CompareSequences(a, b, path, depth, in_model);
    } else if (type == YAML::NodeType::Map) {
      CompareMaps(a, b, path, depth, top_level, in_model);
    }
  }

  ConfigDiff Take() && { return std::move(diff_); }

 private:
  bool Visit(int depth) {
    if (depth > kMaxDepth || ++visits_ > kMaxVisits) {
      diff_.complete = false;
      return false;
    }
    return diff_.complete;
  }

  void Add(Kind kind, const std::string& path, const YAML::Node* a,
           const YAML::Node* b, bool list_item) {
    ++diff_.total;
    if (diff_.differences.size() >= kMaxListedDifferences) return;
    ConfigDifference& d = diff_.differences.emplace_back();
    d.kind = kind;
    d.path = path;
    d.list_item = list_item;
    if (a != nullptr) d.old_value = ShowValue(*a);
    if (b != nullptr) d.new_value = ShowValue(*b);
  }

  // The items the hash covers, with their positions in the file.
  std::vector<std::pair<YAML::Node, size_t>> Items(const YAML::Node& seq,
                                                   bool in_model) const {
    std::vector<std::pair<YAML::Node, size_t>> items;
    size_t index = 0;
    for (const YAML::Node& item : seq) {
      if (!IsIgnoredListItem(scope_, item, in_model)) {
        items.emplace_back(item, index);
      }
      ++index;
    }
    return items;
  }

  void CompareSequences(const YAML::Node& a, const YAML::Node& b,
                        const std::string& path, int depth, bool in_model) {
    const auto old_items = Items(a, in_model);
    const auto new_items = Items(b, in_model);
    auto at = [&](size_t index) { return absl::StrCat(path, "[", index, "]"); };
    const size_t common = std::min(old_items.size(), new_items.size());
    for (size_t i = 0; i < common && diff_.complete; ++i) {
      Compare(old_items[i].first, new_items[i].first, at(new_items[i].second),
              depth + 1, false, in_model,
              /*list_item=*/true);
    }
    for (size_t i = common; i < new_items.size(); ++i) {
      Add(Kind::kOnlyInNew, at(new_items[i].second), nullptr,
          &new_items[i].first, /*list_item=*/true);
    }
    for (size_t i = common; i < old_items.size(); ++i) {
      Add(Kind::kOnlyInOld, at(old_items[i].second), &old_items[i].first,
          nullptr, /*list_item=*/true);
    }
  }

  struct Entry {
    std::string key;
    YAML::Node value;
    bool model = false;  // The value is in the model section.
    bool paired = false;
  };

  std::vector<Entry> Entries(const YAML::Node& map, bool top_level,
                             bool in_model) const {
    std::vector<Entry> entries;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const bool scalar_key = it->first.IsScalar();
      if (scalar_key &&
          IsIgnoredKey(scope_, it->first.Scalar(), top_level, in_model)) {
        continue;
      }
      entries.push_back({.key = KeyText(it->first),
                         .value = it->second,
                         .model = in_model || (top_level && scalar_key &&
                                               it->first.Scalar() == "model")});
    }
    return entries;
  }

  void CompareMaps(const YAML::Node& a, const YAML::Node& b,
                   const std::string& path, int depth, bool top_level,
                   bool in_model) {
    std::vector<Entry> old_entries = Entries(a, top_level, in_model);
    std::vector<Entry> new_entries = Entries(b, top_level, in_model);
    auto child = [&](const std::string& key) {
      return path.empty() ? key : absl::StrCat(path, ".", key);
    };
    // This job's order: the file the user is editing. A repeated key (which
    // the job parser refuses) pairs with the same occurrence on the other
    // side, as the hash's stable sort orders them.
    for (Entry& n : new_entries) {
      if (!diff_.complete) return;
      auto o = absl::c_find_if(old_entries, [&](const Entry& e) {
        return !e.paired && e.key == n.key;
      });
      if (o == old_entries.end()) {
        Add(Kind::kOnlyInNew, child(n.key), nullptr, &n.value, false);
        continue;
      }
      o->paired = true;
      Compare(o->value, n.value, child(n.key), depth + 1, false, n.model,
              false);
    }
    for (const Entry& o : old_entries) {
      if (!o.paired)
        Add(Kind::kOnlyInOld, child(o.key), &o.value, nullptr, false);
    }
  }

  const ConfigScope scope_;
  int64_t visits_ = 0;
  ConfigDiff diff_;
};

absl::StatusOr<YAML::Node> Load(absl::string_view yaml,
                                absl::string_view which) {
  return LoadYaml(yaml, which, YamlDocuments::kExactlyOne);
}

std::optional<int64_t> IntAt(const YAML::Node& doc,
                             std::initializer_list<const char*> keys) {
  std::optional<std::string> text = YamlScalarAt(doc, keys);
  int64_t value = 0;
  if (!text.has_value() || !absl::SimpleAtoi(*text, &value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

absl::StatusOr<ConfigDiff> DiffJobConfigs(absl::string_view old_yaml,
                                          absl::string_view new_yaml,
                                          ConfigScope scope) {
  try {
    absl::StatusOr<YAML::Node> old_doc = Load(old_yaml, "checkpoint's job");
    if (!old_doc.ok()) return old_doc.status();
    absl::StatusOr<YAML::Node> new_doc = Load(new_yaml, "this job");
    if (!new_doc.ok()) return new_doc.status();
    return DiffJobDocuments(*old_doc, *new_doc, scope);
  } catch (const std::exception& e) {
    // yaml-cpp throws on what it cannot represent; the boundary must not.
    return absl::InternalError(
        absl::StrCat("comparing job configurations: ", e.what()));
  }
}

absl::StatusOr<ConfigDiff> DiffJobDocuments(const YAML::Node& old_doc,
                                            const YAML::Node& new_doc,
                                            ConfigScope scope) {
  try {
    Differ differ(scope);
    differ.Compare(old_doc, new_doc, "", 0, /*top_level=*/true,
                   /*in_model=*/false, /*list_item=*/false);
    return std::move(differ).Take();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("comparing job configurations: ", e.what()));
  }
}

std::string DescribeConfigDiff(const ConfigDiff& diff, int max_listed) {
  std::vector<std::string> parts;
  bool labeled = false;  // The first pair of values says which is which.
  const int listed =
      std::min<int>(std::max(max_listed, 0), diff.differences.size());
  for (int i = 0; i < listed; ++i) {
    const ConfigDifference& d = diff.differences[i];
    const std::string path = d.path.empty() ? "the job file" : d.path;
    const char* const set = d.list_item ? " is" : " is set";
    switch (d.kind) {
      case Kind::kChanged:
        if (!d.old_value.has_value() || !d.new_value.has_value()) {
          parts.push_back(absl::StrCat(path, " differs"));
        } else if (!labeled) {
          labeled = true;
          parts.push_back(absl::StrCat(path, " differs (", *d.old_value,
                                       " in the checkpoint, ", *d.new_value,
                                       " in this job)"));
        } else {
          parts.push_back(absl::StrCat(path, " differs (", *d.old_value, ", ",
                                       *d.new_value, ")"));
        }
        break;
      case Kind::kOnlyInNew:
        parts.push_back(absl::StrCat(path, set, " in this job only (",
                                     d.new_value.value_or(""), ")"));
        break;
      case Kind::kOnlyInOld:
        parts.push_back(absl::StrCat(path, set, " in the checkpoint only (",
                                     d.old_value.value_or(""), ")"));
        break;
    }
  }
  if (const int64_t more = diff.total - listed; more > 0) {
    parts.push_back(absl::StrCat("and ", more, " more"));
  }
  if (!diff.complete) {
    parts.push_back(
        "and perhaps more (the files are too large to compare "
        "in full)");
  }
  return absl::StrJoin(parts, "; ");
}

std::optional<StepsChange> FindStepsChange(const ConfigDiff& training_diff,
                                           absl::string_view old_yaml,
                                           absl::string_view new_yaml) {
  if (!training_diff.complete ||
      training_diff.total !=
          static_cast<int64_t>(training_diff.differences.size())) {
    return std::nullopt;
  }
  bool steps_differ = false;
  for (const ConfigDifference& d : training_diff.differences) {
    if (d.path == "training.steps" && d.kind == Kind::kChanged) {
      steps_differ = true;
    } else if (d.path != "optimizer.schedule.total_steps") {
      return std::nullopt;
    }
  }
  // The schedule's length alone is another schedule, not a longer run.
  if (!steps_differ) return std::nullopt;
  try {
    absl::StatusOr<YAML::Node> old_doc = Load(old_yaml, "checkpoint's job");
    absl::StatusOr<YAML::Node> new_doc = Load(new_yaml, "this job");
    if (!old_doc.ok() || !new_doc.ok()) return std::nullopt;
    StepsChange change;
    std::optional<int64_t> old_steps = IntAt(*old_doc, {"training", "steps"});
    std::optional<int64_t> new_steps = IntAt(*new_doc, {"training", "steps"});
    if (!old_steps.has_value() || !new_steps.has_value() || *old_steps < 1 ||
        *new_steps < 1) {
      return std::nullopt;
    }
    change.old_steps = *old_steps;
    change.new_steps = *new_steps;
    // Equal on both sides: only total_steps may differ in the schedule.
    change.schedule_kind =
        YamlScalarAt(*new_doc, {"optimizer", "schedule", "kind"})
            .value_or("constant");
    change.warmup_steps =
        IntAt(*new_doc, {"optimizer", "schedule", "warmup_steps"}).value_or(0);
    if (change.schedule_kind == "cosine") {
      // engine::ResolveSchedule: total_steps unset spans training.steps.
      auto span = [](const YAML::Node& doc, int64_t steps) -> int64_t {
        return IntAt(doc, {"optimizer", "schedule", "total_steps"})
            .value_or(steps);
      };
      change.old_span = span(*old_doc, change.old_steps);
      change.new_span = span(*new_doc, change.new_steps);
    }
    return change;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace conveyor::job
