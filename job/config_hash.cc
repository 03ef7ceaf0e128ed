#include "job/config_hash.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/yaml_reader.h"
#include "job/config_scope.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t Fnv1a64(absl::string_view a, absl::string_view b) {
  uint64_t h = kFnvOffset;
  for (absl::string_view part : {a, b}) {
    for (char c : part) {
      h ^= static_cast<uint8_t>(c);
      h *= kFnvPrime;
    }
  }
  return h;
}

// The canonical text of a YAML tree. Every node starts with a type letter
// and every scalar and collection carries its length, so two different
// trees never serialize to the same text. Bounded in depth and size, since
// aliases can make a small file a very large (or, with a self-reference,
// infinite) tree.
class Canonicalizer {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr size_t kMaxBytes = size_t{16} << 20;

  explicit Canonicalizer(ConfigScope scope) : scope_(scope) {}

  // False if the tree is beyond the bounds. `in_model`: the node is in the
  // top-level model section.
  bool Append(const YAML::Node& node, int depth, bool top_level,
              bool in_model = false) {
    if (depth > kMaxDepth || out_.size() > kMaxBytes) return false;
    switch (node.Type()) {
      case YAML::NodeType::Scalar:
        absl::StrAppend(&out_, "S", node.Scalar().size(), ":", node.Scalar());
        return true;
      case YAML::NodeType::Sequence: {
        std::vector<YAML::Node> items;
        for (const YAML::Node& item : node) {
          if (!IsIgnoredListItem(scope_, item, in_model)) {
            items.push_back(item);
          }
        }
        absl::StrAppend(&out_, "L", items.size(), "[");
        for (const YAML::Node& item : items) {
          if (!Append(item, depth + 1, false, in_model)) return false;
        }
        out_ += "]";
        return true;
      }
      case YAML::NodeType::Map:
        return AppendMap(node, depth, top_level, in_model);
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        out_ += "N";
        return true;
    }
    return false;
  }

  const std::string& text() const { return out_; }

 private:
  bool AppendMap(const YAML::Node& node, int depth, bool top_level,
                 bool in_model) {
    // Sorted by index: assigning a YAML::Node (as a sort of the nodes
    // themselves would) rebinds the node it refers to inside the tree.
    std::vector<std::pair<std::string, size_t>> keys;
    std::vector<YAML::Node> values;
    std::vector<bool> model_values;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const bool scalar_key = it->first.IsScalar();
      if (scalar_key &&
          IsIgnoredKey(scope_, it->first.Scalar(), top_level, in_model)) {
        continue;
      }
      Canonicalizer key(scope_);
      if (!key.Append(it->first, depth + 1, false)) return false;
      keys.emplace_back(key.text(), values.size());
      values.push_back(it->second);
      model_values.push_back(in_model || (top_level && scalar_key &&
                                          it->first.Scalar() == "model"));
    }
    std::stable_sort(
        keys.begin(), keys.end(),
        [](const auto& a, const auto& b) { return a.first < b.first; });
    absl::StrAppend(&out_, "M", keys.size(), "{");
    for (const auto& [key, index] : keys) {
      out_ += key;
      if (!Append(values[index], depth + 1, false, model_values[index])) {
        return false;
      }
    }
    out_ += "}";
    return true;
  }

  const ConfigScope scope_;
  std::string out_;
};

// `doc`: the text's document, or null when it did not load.
std::string HashJob(const YAML::Node* doc, absl::string_view yaml_text,
                    ConfigScope scope) {
  const bool layout_free = scope == ConfigScope::kTraining;
  const absl::string_view canonical_tag =
      layout_free ? "conveyor-job-training-v1\n" : "conveyor-job-config-v1\n";
  const absl::string_view raw_tag = layout_free
                                        ? "conveyor-job-training-raw-v1\n"
                                        : "conveyor-job-config-raw-v1\n";
  try {
    if (doc != nullptr) {
      Canonicalizer canonical(scope);
      if (canonical.Append(*doc, 0, /*top_level=*/true)) {
        return absl::StrFormat("%016x",
                               Fnv1a64(canonical_tag, canonical.text()));
      }
    }
  } catch (const std::exception&) {
    // Fall back to the raw text below: a hash must always come out.
  }
  return absl::StrFormat("%016x", Fnv1a64(raw_tag, yaml_text));
}

// One load for both hashes of a text (null document when it does not load).
JobHashes HashText(absl::string_view yaml_text) {
  std::optional<YAML::Node> doc;
  try {
    absl::StatusOr<YAML::Node> loaded =
        LoadYaml(yaml_text, "job", YamlDocuments::kExactlyOne);
    if (loaded.ok()) doc = *std::move(loaded);
  } catch (const std::exception&) {
    // Hashed as raw text, as a text that does not load is.
  }
  return HashJobDocument(doc.has_value() ? &*doc : nullptr, yaml_text);
}

}  // namespace

JobHashes HashJobDocument(const YAML::Node* doc, absl::string_view yaml_text) {
  return {.config = HashJob(doc, yaml_text, ConfigScope::kConfig),
          .training = HashJob(doc, yaml_text, ConfigScope::kTraining)};
}

std::string JobConfigHash(absl::string_view yaml_text) {
  return HashText(yaml_text).config;
}

std::string JobTrainingHash(absl::string_view yaml_text) {
  return HashText(yaml_text).training;
}

JobHashes HashJobText(absl::string_view yaml_text) {
  return HashText(yaml_text);
}

}  // namespace conveyor::job
