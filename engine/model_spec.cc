#include "engine/model_spec.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::engine {
namespace {

// Allowed keys or enum values. A braced list converts to it for the duration
// of a call.
using Keys = absl::Span<const absl::string_view>;

struct KindName {
  LayerKind kind;
  absl::string_view name;
};

// In the order the error for an unknown kind lists them.
constexpr KindName kKindNames[] = {
    {LayerKind::kDense, "dense"},
    {LayerKind::kRelu, "relu"},
    {LayerKind::kGelu, "gelu"},
    {LayerKind::kLayerNorm, "layernorm"},
    {LayerKind::kEmbedding, "embedding"},
    {LayerKind::kAttention, "attention"},
    {LayerKind::kTransformerBlock, "transformer_block"},
    {LayerKind::kLmHead, "lm_head"},
};

constexpr absl::string_view kBoundary = "boundary";
constexpr absl::string_view kRepeat = "repeat";

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Product of `shape`, or `limit` + 1 once it exceeds `limit` (so that a rank-8
// shape of huge dimensions cannot overflow).
int64_t ElementsCapped(const std::vector<int64_t>& shape, int64_t limit) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > limit / d) return limit + 1;
    n *= d;
  }
  return n;
}

// How a node looks in an error message: "'abc'", "a list", ...
std::string Describe(const YAML::Node& node) {
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
  // The "!" tag marks a quoted scalar: a string even when it looks like a
  // number, which is exactly what the user needs to be told.
  if (node.Tag() == "!")
    return absl::StrCat("the quoted string \"", node.Scalar(), "\"");
  return absl::StrCat("'", node.Scalar(), "'");
}

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

ParamSpec MakeParam(absl::string_view prefix, absl::string_view name,
                    std::vector<int64_t> shape, ParamInit init,
                    double bound_or_std) {
  return ParamSpec{absl::StrCat(prefix, name), std::move(shape), init,
                   bound_or_std};
}

// PyTorch's default Linear init: kaiming_uniform(a=sqrt(5)) for the weight and
// U(±1/sqrt(fan_in)) for the bias reduce to the same bound.
double LinearBound(int64_t fan_in) {
  return 1.0 / std::sqrt(static_cast<double>(fan_in));
}

// torch.nn.MultiheadAttention's parameters: in_proj_weight [3q, d] with
// xavier_uniform over the whole packed matrix, zero biases, out_proj as a
// Linear(q, d) with a zeroed bias.
void AddAttentionParams(absl::string_view prefix, int64_t d, int64_t q,
                        bool bias, std::vector<ParamSpec>& params) {
  params.push_back(MakeParam(prefix, "in_proj_weight", {3 * q, d},
                             ParamInit::kXavierUniform,
                             std::sqrt(6.0 / static_cast<double>(d + 3 * q))));
  if (bias) {
    params.push_back(
        MakeParam(prefix, "in_proj_bias", {3 * q}, ParamInit::kZeros, 0.0));
  }
  params.push_back(MakeParam(prefix, "out_proj.weight", {d, q},
                             ParamInit::kUniform, LinearBound(q)));
  if (bias) {
    params.push_back(
        MakeParam(prefix, "out_proj.bias", {d}, ParamInit::kZeros, 0.0));
  }
}

void AddLayerNormParams(absl::string_view prefix, int64_t d,
                        std::vector<ParamSpec>& params) {
  params.push_back(MakeParam(prefix, "weight", {d}, ParamInit::kOnes, 0.0));
  params.push_back(MakeParam(prefix, "bias", {d}, ParamInit::kZeros, 0.0));
}

void AddLinearParams(absl::string_view prefix, int64_t in, int64_t out,
                     bool bias, std::vector<ParamSpec>& params) {
  params.push_back(MakeParam(prefix, "weight", {out, in}, ParamInit::kUniform,
                             LinearBound(in)));
  if (bias) {
    params.push_back(
        MakeParam(prefix, "bias", {out}, ParamInit::kUniform, LinearBound(in)));
  }
}

// A YAML node with the path and position its errors report. For a null map
// value (`features:` with nothing after it) yaml-cpp marks the next token, so
// the position is the key's instead.
struct Value {
  YAML::Node node;
  std::string path;
  SourceLocation where;
};

struct MapEntry {
  std::string key;
  Value value;
  SourceLocation key_where;
};

const MapEntry* Find(const std::vector<MapEntry>& map, absl::string_view key) {
  for (const MapEntry& entry : map) {
    if (entry.key == key) return &entry;
  }
  return nullptr;
}

// One entry of the expanded layer list before shape inference: a layer with
// its options, path and position, or a boundary (only path and position).
struct Entry {
  bool boundary = false;
  LayerSpec layer;
};

// Holds the file name for positions; one per parse.
class SpecParser {
 public:
  explicit SpecParser(absl::string_view file) : file_(file) {}

  SourceLocation Loc(const YAML::Node& node) const {
    SourceLocation where{file_, 0, 0};
    if (!node.IsDefined()) return where;
    const YAML::Mark mark = node.Mark();
    if (mark.is_null()) return where;
    where.line = mark.line + 1;
    where.column = mark.column + 1;
    return where;
  }

  absl::Status Error(const SourceLocation& where, absl::string_view path,
                     absl::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(where.ToString(), ": ", path, ": ", message));
  }
  absl::Status Error(const Value& value, absl::string_view message) const {
    return Error(value.where, value.path, message);
  }

  absl::StatusOr<ModelSpec> Parse(const Value& model) const;

 private:
  // The entries of a map, after rejecting non-scalar keys and duplicate keys
  // (yaml-cpp 0.7 keeps both and `[]` returns the first, so a duplicate would
  // otherwise be silently ignored). A null node reads as an empty map when
  // `null_is_empty`.
  absl::StatusOr<std::vector<MapEntry>> ReadAnyMap(const Value& value,
                                                   bool null_is_empty) const;
  // ReadAnyMap, then rejects keys not in `allowed`.
  absl::StatusOr<std::vector<MapEntry>> ReadMap(const Value& value,
                                                Keys allowed,
                                                bool null_is_empty) const;
  absl::StatusOr<const MapEntry*> Require(const std::vector<MapEntry>& map,
                                          const Value& parent,
                                          absl::string_view key) const;

  absl::StatusOr<int64_t> ParseInt(const Value& value, int64_t min,
                                   int64_t max) const;
  absl::StatusOr<bool> ParseBool(const Value& value) const;
  absl::StatusOr<double> ParsePositiveDouble(const Value& value) const;
  // Index of the value in `allowed`.
  absl::StatusOr<int> ParseEnum(const Value& value, Keys allowed) const;

  absl::StatusOr<std::vector<int64_t>> ParseInputShape(
      const Value& value) const;
  absl::Status ParseInit(const Value& value, ModelSpec& spec) const;

  // Appends the expansion of a `layers:` list to `out`. `depth` counts the
  // enclosing repeats.
  absl::Status ExpandList(const Value& list, int depth,
                          std::vector<Entry>& out) const;
  absl::Status ExpandEntry(const Value& item, int depth,
                           std::vector<Entry>& out) const;
  absl::Status ExpandRepeat(const Value& item, int depth,
                            std::vector<Entry>& out) const;
  absl::StatusOr<LayerSpec> ParseLayer(LayerKind kind, const Value& options,
                                       const Value& item) const;

  absl::Status CheckBoundaries(const std::vector<Entry>& entries) const;
  absl::Status InferLayer(LayerSpec& layer) const;
  absl::Status LayerError(const LayerSpec& layer,
                          absl::string_view message) const {
    return Error(layer.where, layer.path,
                 absl::StrCat(LayerKindName(layer.kind), " (layer ",
                              layer.index, "): ", message));
  }

  std::string file_;
};

absl::StatusOr<std::vector<MapEntry>> SpecParser::ReadAnyMap(
    const Value& value, bool null_is_empty) const {
  std::vector<MapEntry> entries;
  if (value.node.IsNull() && null_is_empty) return entries;
  if (!value.node.IsMap()) {
    return Error(value,
                 absl::StrCat("must be a map; got ", Describe(value.node)));
  }
  for (auto it = value.node.begin(); it != value.node.end(); ++it) {
    const YAML::Node& key_node = it->first;
    const SourceLocation key_where = Loc(key_node);
    if (!key_node.IsScalar()) {
      return Error(
          key_where, value.path,
          absl::StrCat("keys must be strings; got ", Describe(key_node)));
    }
    const std::string& key = key_node.Scalar();
    if (Find(entries, key) != nullptr) {
      return Error(key_where, value.path,
                   absl::StrCat("duplicate key '", key, "'"));
    }
    const YAML::Node& child = it->second;
    entries.push_back(MapEntry{key,
                               Value{child, absl::StrCat(value.path, ".", key),
                                     child.IsNull() ? key_where : Loc(child)},
                               key_where});
  }
  return entries;
}

absl::StatusOr<std::vector<MapEntry>> SpecParser::ReadMap(
    const Value& value, Keys allowed, bool null_is_empty) const {
  ASSIGN_OR_RETURN(std::vector<MapEntry> entries,
                   ReadAnyMap(value, null_is_empty));
  for (const MapEntry& entry : entries) {
    bool known = false;
    for (absl::string_view a : allowed) known = known || a == entry.key;
    if (known) continue;
    return Error(entry.key_where, value.path,
                 allowed.size() == 0
                     ? absl::StrCat("unknown key '", entry.key,
                                    "'; this takes no options")
                     : absl::StrCat("unknown key '", entry.key, "'; allowed: ",
                                    absl::StrJoin(allowed, ", ")));
  }
  return entries;
}

absl::StatusOr<const MapEntry*> SpecParser::Require(
    const std::vector<MapEntry>& map, const Value& parent,
    absl::string_view key) const {
  const MapEntry* entry = Find(map, key);
  if (entry == nullptr) {
    return Error(parent, absl::StrCat("missing required key '", key, "'"));
  }
  return entry;
}

absl::StatusOr<int64_t> SpecParser::ParseInt(const Value& value, int64_t min,
                                             int64_t max) const {
  const std::string expected =
      min == 1   ? std::string("must be a positive integer")
      : min == 0 ? std::string("must be a non-negative integer")
                 : absl::StrCat("must be an integer in [", min, ", ", max, "]");
  if (!IsPlainScalar(value.node) || !IsDecimalInteger(value.node.Scalar())) {
    return Error(value, absl::StrCat(expected, "; got ", Describe(value.node)));
  }
  const std::string& text = value.node.Scalar();
  int64_t n = 0;
  // Digits that do not fit int64 are out of range on one side or the other.
  const bool fits = absl::SimpleAtoi(text, &n);
  if ((!fits && text[0] == '-') || (fits && n < min)) {
    return Error(value, absl::StrCat(expected, "; got ", Describe(value.node)));
  }
  if (!fits || n > max) {
    return Error(value, absl::StrCat("must be at most ", max, "; got ", text));
  }
  return n;
}

absl::StatusOr<bool> SpecParser::ParseBool(const Value& value) const {
  // YAML 1.2's core schema: yaml-cpp would also take yes/no/on/off, which
  // YAML 1.2 reads as strings, so accepting them would make the same file
  // mean different things to different tools.
  if (IsPlainScalar(value.node)) {
    const std::string& s = value.node.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
  }
  return Error(
      value, absl::StrCat("must be true or false; got ", Describe(value.node)));
}

absl::StatusOr<double> SpecParser::ParsePositiveDouble(
    const Value& value) const {
  double d = 0;
  if (IsPlainScalar(value.node) && absl::SimpleAtod(value.node.Scalar(), &d) &&
      std::isfinite(d) && d > 0) {
    return d;
  }
  return Error(value, absl::StrCat("must be a positive number; got ",
                                   Describe(value.node)));
}

absl::StatusOr<int> SpecParser::ParseEnum(const Value& value,
                                          Keys allowed) const {
  if (value.node.IsScalar()) {
    int i = 0;
    for (absl::string_view a : allowed) {
      if (value.node.Scalar() == a) return i;
      ++i;
    }
  }
  return Error(value,
               absl::StrCat("must be one of: ", absl::StrJoin(allowed, ", "),
                            "; got ", Describe(value.node)));
}

absl::StatusOr<std::vector<int64_t>> SpecParser::ParseInputShape(
    const Value& value) const {
  if (!value.node.IsSequence() || value.node.size() == 0) {
    return Error(value,
                 absl::StrCat("must be a non-empty list of positive integers "
                              "(the shape of one sample); got ",
                              Describe(value.node)));
  }
  if (value.node.size() > static_cast<size_t>(kMaxInputRank)) {
    return Error(
        value, absl::StrCat("has ", value.node.size(), " dimensions; at most ",
                            kMaxInputRank, " are supported"));
  }
  std::vector<int64_t> shape;
  for (size_t i = 0; i < value.node.size(); ++i) {
    const YAML::Node dim = value.node[i];
    const Value dim_value{dim, absl::StrCat(value.path, "[", i, "]"),
                          dim.IsNull() ? value.where : Loc(dim)};
    ASSIGN_OR_RETURN(int64_t d, ParseInt(dim_value, 1, kMaxModelDimension));
    shape.push_back(d);
  }
  if (ElementsCapped(shape, kMaxSampleElements) > kMaxSampleElements) {
    return Error(value, absl::StrCat("has more than ", kMaxSampleElements,
                                     " elements per sample"));
  }
  return shape;
}

absl::Status SpecParser::ParseInit(const Value& value, ModelSpec& spec) const {
  ASSIGN_OR_RETURN(std::vector<MapEntry> map,
                   ReadMap(value, {"seed", "from"}, /*null_is_empty=*/false));
  const MapEntry* seed = Find(map, "seed");
  const MapEntry* from = Find(map, "from");
  if ((seed == nullptr) == (from == nullptr)) {
    return Error(value,
                 "give exactly one of 'seed' (an integer >= 0) or 'from' (a "
                 "safetensors file)");
  }
  if (seed != nullptr) {
    const YAML::Node& node = seed->value.node;
    uint64_t n = 0;
    const bool digits = IsPlainScalar(node) &&
                        IsDecimalInteger(node.Scalar()) &&
                        node.Scalar()[0] != '-';
    if (!digits) {
      return Error(
          seed->value,
          absl::StrCat("must be a non-negative integer; got ", Describe(node)));
    }
    if (!absl::SimpleAtoi(node.Scalar(), &n)) {
      return Error(seed->value, absl::StrCat("must be at most 2^64 - 1; got ",
                                             node.Scalar()));
    }
    spec.seed = n;
  } else {
    const YAML::Node& node = from->value.node;
    if (!node.IsScalar() || node.Scalar().empty()) {
      return Error(from->value,
                   absl::StrCat("must be the path of a safetensors file; got ",
                                Describe(node)));
    }
    spec.init_from = node.Scalar();
  }
  return absl::OkStatus();
}

absl::Status SpecParser::ExpandList(const Value& list, int depth,
                                    std::vector<Entry>& out) const {
  if (!list.node.IsSequence() || list.node.size() == 0) {
    return Error(list, absl::StrCat("must be a non-empty list of layers; got ",
                                    Describe(list.node)));
  }
  for (size_t i = 0; i < list.node.size(); ++i) {
    const YAML::Node item = list.node[i];
    SourceLocation where = Loc(item);
    if (where.line == 0) where = list.where;
    RETURN_IF_ERROR(ExpandEntry(
        Value{item, absl::StrCat(list.path, "[", i, "]"), std::move(where)},
        depth, out));
  }
  return absl::OkStatus();
}

absl::Status SpecParser::ExpandEntry(const Value& item, int depth,
                                     std::vector<Entry>& out) const {
  std::string name;
  // The options: null for a bare scalar (`- relu`), else the kind's value.
  Value options;
  if (item.node.IsScalar()) {
    name = item.node.Scalar();
    options = Value{YAML::Node(YAML::NodeType::Null),
                    absl::StrCat(item.path, ".", name), item.where};
  } else if (item.node.IsMap()) {
    ASSIGN_OR_RETURN(std::vector<MapEntry> map,
                     ReadAnyMap(item, /*null_is_empty=*/false));
    if (Find(map, kRepeat) != nullptr) return ExpandRepeat(item, depth, out);
    if (map.size() != 1) {
      std::vector<std::string> keys;
      for (const MapEntry& e : map) keys.push_back(e.key);
      // The common cause is options written at the kind's indentation,
      // which YAML reads as sibling keys.
      return Error(
          item, absl::StrCat("a layer is a map with one key, its kind; "
                             "found ",
                             map.size(), " keys (", absl::StrJoin(keys, ", "),
                             "): are the options indented under the kind?"));
    }
    name = map[0].key;
    options = map[0].value;
  } else {
    return Error(item,
                 absl::StrCat("a layer must be a kind (e.g. relu) or a map "
                              "from a kind to its options (e.g. dense: "
                              "{features: 8}); got ",
                              Describe(item.node)));
  }

  if (out.size() >= static_cast<size_t>(kMaxExpandedEntries)) {
    return Error(item, absl::StrCat("the expanded layer list exceeds ",
                                    kMaxExpandedEntries,
                                    " entries (layers and boundaries)"));
  }
  if (name == kBoundary) {
    RETURN_IF_ERROR(ReadMap(options, {}, /*null_is_empty=*/true).status());
    Entry entry;
    entry.boundary = true;
    entry.layer.path = item.path;
    entry.layer.where = item.where;
    out.push_back(std::move(entry));
    return absl::OkStatus();
  }
  if (name == kRepeat) {
    return Error(item,
                 "repeat needs a count and a body: '- repeat: 4' with "
                 "'layers: [...]' at the same indentation as 'repeat'");
  }
  const KindName* kind = nullptr;
  for (const KindName& k : kKindNames) {
    if (k.name == name) kind = &k;
  }
  if (kind == nullptr) {
    std::vector<absl::string_view> names;
    for (const KindName& k : kKindNames) names.push_back(k.name);
    names.push_back(kBoundary);
    names.push_back(kRepeat);
    return Error(item,
                 absl::StrCat("unknown layer kind '", name,
                              "'; allowed: ", absl::StrJoin(names, ", ")));
  }
  ASSIGN_OR_RETURN(LayerSpec layer, ParseLayer(kind->kind, options, item));
  out.push_back(Entry{false, std::move(layer)});
  return absl::OkStatus();
}

absl::Status SpecParser::ExpandRepeat(const Value& item, int depth,
                                      std::vector<Entry>& out) const {
  ASSIGN_OR_RETURN(
      std::vector<MapEntry> map,
      ReadMap(item, {"repeat", "boundary_every", "layers"}, false));
  if (depth >= kMaxRepeatNesting) {
    return Error(item, absl::StrCat("repeats nest more than ",
                                    kMaxRepeatNesting, " levels deep"));
  }
  ASSIGN_OR_RETURN(const MapEntry* count_entry, Require(map, item, "repeat"));
  ASSIGN_OR_RETURN(const int64_t count,
                   ParseInt(count_entry->value, 1, kMaxRepeatCount));
  int64_t every = 0;
  const MapEntry* every_entry = Find(map, "boundary_every");
  if (every_entry != nullptr) {
    ASSIGN_OR_RETURN(every, ParseInt(every_entry->value, 1, count));
  }
  ASSIGN_OR_RETURN(const MapEntry* layers_entry, Require(map, item, "layers"));

  // The body is expanded once and copied, so the work is bounded by the size
  // of the output, which is checked before copying: an alias bomb (a body
  // that refers to itself through anchors many times over) fails here
  // rather than exhausting memory.
  std::vector<Entry> body;
  RETURN_IF_ERROR(ExpandList(layers_entry->value, depth + 1, body));
  const int64_t boundaries = every > 0 ? (count - 1) / every : 0;
  const int64_t total = static_cast<int64_t>(out.size()) +
                        static_cast<int64_t>(body.size()) * count + boundaries;
  if (total > kMaxExpandedEntries) {
    return Error(item, absl::StrCat("repeat expands the layer list past ",
                                    kMaxExpandedEntries,
                                    " entries (layers and boundaries)"));
  }
  for (int64_t r = 1; r <= count; ++r) {
    out.insert(out.end(), body.begin(), body.end());
    if (every > 0 && r % every == 0 && r < count) {
      Entry entry;
      entry.boundary = true;
      entry.layer.path = every_entry->value.path;
      entry.layer.where = every_entry->value.where;
      out.push_back(std::move(entry));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerSpec> SpecParser::ParseLayer(LayerKind kind,
                                                 const Value& options,
                                                 const Value& item) const {
  static constexpr absl::string_view kDenseKeys[] = {"features", "bias"};
  static constexpr absl::string_view kGeluKeys[] = {"approximate"};
  static constexpr absl::string_view kLayerNormKeys[] = {"eps"};
  static constexpr absl::string_view kEmbeddingKeys[] = {
      "vocab_size", "features", "max_positions"};
  static constexpr absl::string_view kAttentionKeys[] = {
      "heads", "causal", "qkv_features", "bias"};
  static constexpr absl::string_view kBlockKeys[] = {
      "heads", "mlp_features", "causal", "norm", "eps", "approximate"};
  static constexpr absl::string_view kLmHeadKeys[] = {"vocab_size", "bias"};
  Keys keys;  // relu: none
  switch (kind) {
    case LayerKind::kDense:
      keys = kDenseKeys;
      break;
    case LayerKind::kRelu:
      break;
    case LayerKind::kGelu:
      keys = kGeluKeys;
      break;
    case LayerKind::kLayerNorm:
      keys = kLayerNormKeys;
      break;
    case LayerKind::kEmbedding:
      keys = kEmbeddingKeys;
      break;
    case LayerKind::kAttention:
      keys = kAttentionKeys;
      break;
    case LayerKind::kTransformerBlock:
      keys = kBlockKeys;
      break;
    case LayerKind::kLmHead:
      keys = kLmHeadKeys;
      break;
  }
  ASSIGN_OR_RETURN(std::vector<MapEntry> map,
                   ReadMap(options, keys, /*null_is_empty=*/true));

  LayerSpec layer;
  layer.kind = kind;
  layer.path = item.path;
  layer.where = item.where;
  if (kind == LayerKind::kLmHead) layer.bias = false;

  // Every option is optional here; Require() below enforces the required
  // ones per kind. Unknown keys were rejected by ReadMap.
  auto dim = [&](absl::string_view key, bool required, int64_t min,
                 int64_t& field) -> absl::Status {
    const MapEntry* e = Find(map, key);
    if (e == nullptr) {
      if (required) return Require(map, options, key).status();
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(field, ParseInt(e->value, min, kMaxModelDimension));
    return absl::OkStatus();
  };
  auto flag = [&](absl::string_view key, bool& field) -> absl::Status {
    if (const MapEntry* e = Find(map, key); e != nullptr) {
      ASSIGN_OR_RETURN(field, ParseBool(e->value));
    }
    return absl::OkStatus();
  };
  auto approximate = [&]() -> absl::Status {
    if (const MapEntry* e = Find(map, "approximate"); e != nullptr) {
      ASSIGN_OR_RETURN(const int i, ParseEnum(e->value, {"none", "tanh"}));
      layer.approximate_tanh = i == 1;
    }
    return absl::OkStatus();
  };
  auto eps = [&]() -> absl::Status {
    if (const MapEntry* e = Find(map, "eps"); e != nullptr) {
      ASSIGN_OR_RETURN(layer.eps, ParsePositiveDouble(e->value));
    }
    return absl::OkStatus();
  };

  switch (kind) {
    case LayerKind::kDense:
      RETURN_IF_ERROR(dim("features", true, 1, layer.features));
      RETURN_IF_ERROR(flag("bias", layer.bias));
      break;
    case LayerKind::kRelu:
      break;
    case LayerKind::kGelu:
      RETURN_IF_ERROR(approximate());
      break;
    case LayerKind::kLayerNorm:
      RETURN_IF_ERROR(eps());
      break;
    case LayerKind::kEmbedding:
      RETURN_IF_ERROR(dim("vocab_size", true, 1, layer.vocab_size));
      RETURN_IF_ERROR(dim("features", true, 1, layer.features));
      RETURN_IF_ERROR(dim("max_positions", false, 0, layer.max_positions));
      break;
    case LayerKind::kAttention:
      RETURN_IF_ERROR(dim("heads", true, 1, layer.heads));
      RETURN_IF_ERROR(flag("causal", layer.causal));
      RETURN_IF_ERROR(dim("qkv_features", false, 0, layer.qkv_features));
      RETURN_IF_ERROR(flag("bias", layer.bias));
      break;
    case LayerKind::kTransformerBlock:
      RETURN_IF_ERROR(dim("heads", true, 1, layer.heads));
      RETURN_IF_ERROR(dim("mlp_features", true, 1, layer.mlp_features));
      RETURN_IF_ERROR(flag("causal", layer.causal));
      if (const MapEntry* e = Find(map, "norm"); e != nullptr) {
        ASSIGN_OR_RETURN(const int i, ParseEnum(e->value, {"post", "pre"}));
        layer.pre_norm = i == 1;
      }
      RETURN_IF_ERROR(eps());
      RETURN_IF_ERROR(approximate());
      break;
    case LayerKind::kLmHead:
      RETURN_IF_ERROR(dim("vocab_size", true, 1, layer.vocab_size));
      RETURN_IF_ERROR(flag("bias", layer.bias));
      break;
  }
  return layer;
}

absl::Status SpecParser::CheckBoundaries(
    const std::vector<Entry>& entries) const {
  int layers_before = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (!e.boundary) {
      ++layers_before;
      continue;
    }
    // Each case would leave a pipeline stage with no layers.
    if (i == 0) {
      return Error(e.layer.where, e.layer.path,
                   "a boundary cannot come first (before layer 0): the stage "
                   "before it would have no layers");
    }
    if (i + 1 == entries.size()) {
      return Error(e.layer.where, e.layer.path,
                   absl::StrCat("a boundary cannot come last (after layer ",
                                layers_before - 1,
                                "): the stage after it would have no layers"));
    }
    if (entries[i - 1].boundary) {
      return Error(e.layer.where, e.layer.path,
                   absl::StrCat("two boundaries in a row (after layer ",
                                layers_before - 1,
                                "): the stage between them would have no "
                                "layers"));
    }
  }
  return absl::OkStatus();
}

absl::Status SpecParser::InferLayer(LayerSpec& layer) const {
  const std::vector<int64_t>& in = layer.input_shape;
  const int64_t d = in.back();  // every shape here has rank >= 1
  const std::string prefix = absl::StrCat("layers.", layer.index, ".");
  std::vector<int64_t> out = in;
  std::vector<ParamSpec>& params = layer.params;
  auto needs_sequence = [&]() -> absl::Status {
    if (in.size() == 2) return absl::OkStatus();
    return LayerError(
        layer,
        absl::StrCat("needs a 2-D input [seq, features]; got ", ShapeString(in),
                     in.size() == 1 ? " (start with an embedding, or give "
                                      "input_shape as [seq, features])"
                                    : ""));
  };
  switch (layer.kind) {
    case LayerKind::kDense:
      AddLinearParams(prefix, d, layer.features, layer.bias, params);
      out.back() = layer.features;
      break;
    case LayerKind::kRelu:
    case LayerKind::kGelu:
      break;
    case LayerKind::kLayerNorm:
      AddLayerNormParams(prefix, d, params);
      break;
    case LayerKind::kEmbedding:
      if (layer.index != 0) {
        return LayerError(layer,
                          "must be the first layer: it takes integer token "
                          "ids, and only the model's input is token ids");
      }
      if (in.size() != 1) {
        return LayerError(layer,
                          absl::StrCat("needs a 1-D input [seq] of token ids; "
                                       "got input_shape ",
                                       ShapeString(in)));
      }
      if (layer.max_positions > 0 && d > layer.max_positions) {
        return LayerError(layer,
                          absl::StrCat("the input has ", d,
                                       " positions, more than max_positions = ",
                                       layer.max_positions));
      }
      params.push_back(MakeParam(prefix, "weight",
                                 {layer.vocab_size, layer.features},
                                 ParamInit::kNormal, 1.0));
      if (layer.max_positions > 0) {
        params.push_back(MakeParam(prefix, "position.weight",
                                   {layer.max_positions, layer.features},
                                   ParamInit::kNormal, 1.0));
      }
      out = {d, layer.features};
      break;
    case LayerKind::kAttention: {
      RETURN_IF_ERROR(needs_sequence());
      if (layer.qkv_features == 0) layer.qkv_features = d;
      if (layer.qkv_features % layer.heads != 0) {
        return LayerError(
            layer, absl::StrCat("qkv_features = ", layer.qkv_features,
                                " is not divisible by heads = ", layer.heads));
      }
      AddAttentionParams(prefix, d, layer.qkv_features, layer.bias, params);
      break;
    }
    case LayerKind::kTransformerBlock: {
      RETURN_IF_ERROR(needs_sequence());
      if (d % layer.heads != 0) {
        return LayerError(layer, absl::StrCat("the input's features (", d,
                                              ") are not divisible by heads = ",
                                              layer.heads));
      }
      layer.qkv_features = d;
      const int64_t m = layer.mlp_features;
      AddAttentionParams(prefix + "attn.", d, d, /*bias=*/true, params);
      AddLayerNormParams(prefix + "norm1.", d, params);
      AddLinearParams(prefix + "mlp.0.", d, m, /*bias=*/true, params);
      AddLinearParams(prefix + "mlp.2.", m, d, /*bias=*/true, params);
      AddLayerNormParams(prefix + "norm2.", d, params);
      break;
    }
    case LayerKind::kLmHead:
      AddLinearParams(prefix, d, layer.vocab_size, layer.bias, params);
      out.back() = layer.vocab_size;
      break;
  }
  if (ElementsCapped(out, kMaxSampleElements) > kMaxSampleElements) {
    return LayerError(
        layer, absl::StrCat("its output ", ShapeString(out), " has more than ",
                            kMaxSampleElements, " elements per sample"));
  }
  layer.output_shape = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<ModelSpec> SpecParser::Parse(const Value& model) const {
  ASSIGN_OR_RETURN(
      std::vector<MapEntry> map,
      ReadMap(model, {"input_shape", "init", "remat", "layers", "loss"},
              /*null_is_empty=*/false));
  ModelSpec spec;

  ASSIGN_OR_RETURN(const MapEntry* input_shape,
                   Require(map, model, "input_shape"));
  ASSIGN_OR_RETURN(spec.input_shape, ParseInputShape(input_shape->value));
  ASSIGN_OR_RETURN(const MapEntry* init, Require(map, model, "init"));
  RETURN_IF_ERROR(ParseInit(init->value, spec));
  if (const MapEntry* remat = Find(map, "remat"); remat != nullptr) {
    ASSIGN_OR_RETURN(spec.remat, ParseBool(remat->value));
  }
  ASSIGN_OR_RETURN(const MapEntry* loss, Require(map, model, "loss"));
  ASSIGN_OR_RETURN(const int loss_index,
                   ParseEnum(loss->value, {"mse", "cross_entropy"}));
  spec.loss = loss_index == 0 ? LossKind::kMse : LossKind::kCrossEntropy;
  ASSIGN_OR_RETURN(const MapEntry* layers, Require(map, model, "layers"));

  std::vector<Entry> entries;
  RETURN_IF_ERROR(ExpandList(layers->value, /*depth=*/0, entries));
  RETURN_IF_ERROR(CheckBoundaries(entries));

  std::vector<int64_t> shape = spec.input_shape;
  int64_t total_params = 0;
  for (Entry& entry : entries) {
    if (entry.boundary) {
      spec.stage_begin.push_back(static_cast<int>(spec.layers.size()));
      continue;
    }
    LayerSpec& layer = entry.layer;
    layer.index = static_cast<int>(spec.layers.size());
    layer.stage = static_cast<int>(spec.stage_begin.size()) - 1;
    layer.input_shape = shape;
    RETURN_IF_ERROR(InferLayer(layer));
    // Each parameter is below 2^50 elements (two dims <= 2^24, one of them
    // possibly tripled), so checking after every layer cannot overflow.
    for (const ParamSpec& p : layer.params) total_params += p.NumElements();
    if (total_params > kMaxModelParams) {
      return LayerError(layer,
                        absl::StrCat("the model reaches ", total_params,
                                     " parameters here, above the limit of ",
                                     kMaxModelParams));
    }
    shape = layer.output_shape;
    spec.layers.push_back(std::move(layer));
  }
  spec.token_input = spec.layers.front().kind == LayerKind::kEmbedding;
  spec.num_stages = static_cast<int>(spec.stage_begin.size());
  spec.output_shape = shape;

  if (spec.loss == LossKind::kMse) {
    spec.target_shape = shape;
    spec.integer_targets = false;
  } else {
    if (shape.back() < 2) {
      return Error(loss->value,
                   absl::StrCat("cross_entropy needs logits [..., classes] "
                                "with at least 2 classes; the model's output "
                                "is ",
                                ShapeString(shape)));
    }
    spec.target_shape.assign(shape.begin(), shape.end() - 1);
    spec.integer_targets = true;
  }
  return spec;
}

// yaml-cpp reports errors by throwing; nothing we call should throw (we never
// use as<T>() or operator[] on a non-map), but a library exception must still
// not escape the boundary.
template <typename F>
absl::StatusOr<ModelSpec> CatchYamlExceptions(absl::string_view file,
                                              F&& parse) {
  try {
    return parse();
  } catch (const YAML::Exception& e) {
    SourceLocation where{std::string(file), 0, 0};
    if (!e.mark.is_null()) {
      where.line = e.mark.line + 1;
      where.column = e.mark.column + 1;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(where.ToString(), ": YAML error: ", e.msg));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(
        file, ": unexpected error parsing the model spec: ", e.what()));
  }
}

}  // namespace

absl::string_view LayerKindName(LayerKind kind) {
  for (const KindName& k : kKindNames) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

absl::string_view ParamInitName(ParamInit init) {
  switch (init) {
    case ParamInit::kUniform:
      return "uniform";
    case ParamInit::kNormal:
      return "normal";
    case ParamInit::kXavierUniform:
      return "xavier_uniform";
    case ParamInit::kOnes:
      return "ones";
    case ParamInit::kZeros:
      return "zeros";
  }
  return "unknown";
}

absl::string_view LossKindName(LossKind loss) {
  switch (loss) {
    case LossKind::kMse:
      return "mse";
    case LossKind::kCrossEntropy:
      return "cross_entropy";
  }
  return "unknown";
}

std::string SourceLocation::ToString() const {
  if (line <= 0) return file;
  return absl::StrCat(file, ":", line, ":", column);
}

int64_t ParamSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int ModelSpec::StageEnd(int stage) const {
  return stage + 1 < num_stages ? stage_begin[stage + 1]
                                : static_cast<int>(layers.size());
}

std::vector<const ParamSpec*> ModelSpec::Params() const {
  std::vector<const ParamSpec*> params;
  for (const LayerSpec& layer : layers) {
    for (const ParamSpec& p : layer.params) params.push_back(&p);
  }
  return params;
}

std::vector<const ParamSpec*> ModelSpec::StageParams(int stage) const {
  std::vector<const ParamSpec*> params;
  for (int i = stage_begin[stage]; i < StageEnd(stage); ++i) {
    for (const ParamSpec& p : layers[i].params) params.push_back(&p);
  }
  return params;
}

int64_t ModelSpec::NumParams() const {
  int64_t n = 0;
  for (const LayerSpec& layer : layers) {
    for (const ParamSpec& p : layer.params) n += p.NumElements();
  }
  return n;
}

absl::StatusOr<ModelSpec> ParseModelSpec(const YAML::Node& model,
                                         absl::string_view file_name) {
  return CatchYamlExceptions(file_name, [&]() -> absl::StatusOr<ModelSpec> {
    SpecParser parser(file_name);
    const Value value{model, "model", parser.Loc(model)};
    if (!model.IsDefined()) {
      return parser.Error(value, "missing: the job has no 'model:' section");
    }
    return parser.Parse(value);
  });
}

absl::StatusOr<ModelSpec> ParseModelSpecYaml(absl::string_view yaml_text,
                                             absl::string_view file_name) {
  return CatchYamlExceptions(file_name, [&]() -> absl::StatusOr<ModelSpec> {
    YAML::Node doc;
    try {
      doc = YAML::Load(std::string(yaml_text));
    } catch (const YAML::ParserException& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_name, ":", e.mark.line + 1, ":", e.mark.column + 1,
                       ": YAML syntax error: ", e.msg));
    }
    SpecParser parser(file_name);
    SourceLocation doc_where = parser.Loc(doc);
    if (doc_where.line == 0) doc_where = {std::string(file_name), 1, 1};
    if (!doc.IsMap()) {
      return parser.Error(doc_where, "(top level)",
                          absl::StrCat("must be a map with a 'model' key; got ",
                                       Describe(doc)));
    }
    std::optional<Value> model;
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (!it->first.IsScalar() || it->first.Scalar() != "model") continue;
      const SourceLocation key_where = parser.Loc(it->first);
      if (model.has_value()) {
        return parser.Error(key_where, "(top level)", "duplicate key 'model'");
      }
      model = Value{it->second, "model",
                    it->second.IsNull() ? key_where : parser.Loc(it->second)};
    }
    if (!model.has_value()) {
      return parser.Error(doc_where, "(top level)",
                          "missing required key 'model'");
    }
    return parser.Parse(*model);
  });
}

}  // namespace conveyor::engine
