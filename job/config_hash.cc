#include "job/config_hash.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/yaml_reader.h"
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

  // False if the tree is beyond the bounds.
  bool Append(const YAML::Node& node, int depth, bool top_level) {
    if (depth > kMaxDepth || out_.size() > kMaxBytes) return false;
    switch (node.Type()) {
      case YAML::NodeType::Scalar:
        absl::StrAppend(&out_, "S", node.Scalar().size(), ":", node.Scalar());
        return true;
      case YAML::NodeType::Sequence:
        absl::StrAppend(&out_, "L", node.size(), "[");
        for (const YAML::Node& item : node) {
          if (!Append(item, depth + 1, false)) return false;
        }
        out_ += "]";
        return true;
      case YAML::NodeType::Map:
        return AppendMap(node, depth, top_level);
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        out_ += "N";
        return true;
    }
    return false;
  }

  const std::string& text() const { return out_; }

 private:
  bool AppendMap(const YAML::Node& node, int depth, bool top_level) {
    // Sections that say where the job's files go, how it recovers or what
    // it measures on the side, not what it trains.
    static constexpr absl::string_view kIgnored[] = {
        "name", "checkpoint", "resume", "restart", "eval"};
    // Sorted by index: assigning a YAML::Node (as a sort of the nodes
    // themselves would) rebinds the node it refers to inside the tree.
    std::vector<std::pair<std::string, size_t>> keys;
    std::vector<YAML::Node> values;
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (top_level && it->first.IsScalar() &&
          std::find(std::begin(kIgnored), std::end(kIgnored),
                    it->first.Scalar()) != std::end(kIgnored)) {
        continue;
      }
      Canonicalizer key;
      if (!key.Append(it->first, depth + 1, false)) return false;
      keys.emplace_back(key.text(), values.size());
      values.push_back(it->second);
    }
    std::stable_sort(
        keys.begin(), keys.end(),
        [](const auto& a, const auto& b) { return a.first < b.first; });
    absl::StrAppend(&out_, "M", keys.size(), "{");
    for (const auto& [key, index] : keys) {
      out_ += key;
      if (!Append(values[index], depth + 1, false)) return false;
    }
    out_ += "}";
    return true;
  }

  std::string out_;
};

}  // namespace

std::string JobConfigHash(absl::string_view yaml_text) {
  constexpr absl::string_view kCanonicalTag = "conveyor-job-config-v1\n";
  constexpr absl::string_view kRawTag = "conveyor-job-config-raw-v1\n";
  uint64_t hash = 0;
  bool hashed = false;
  try {
    absl::StatusOr<YAML::Node> doc =
        LoadYaml(yaml_text, "job", YamlDocuments::kExactlyOne);
    if (doc.ok()) {
      Canonicalizer canonical;
      if (canonical.Append(*doc, 0, /*top_level=*/true)) {
        hash = Fnv1a64(kCanonicalTag, canonical.text());
        hashed = true;
      }
    }
  } catch (const std::exception&) {
    // Fall back to the raw text below: a hash must always come out.
  }
  if (!hashed) hash = Fnv1a64(kRawTag, yaml_text);
  return absl::StrFormat("%016x", hash);
}

}  // namespace conveyor::job
