// Parsing the `model:` section of a job (engine/model_spec.h): reads the
// YAML, expands repeats, places boundaries and parses each layer's options
// through its kind's row, then hands the list to AssembleModel
// (engine/model_spec.cc) and derives the loss's targets.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"
#include "engine/internal/model_spec_internal.h"
#include "engine/layer_kinds.h"
#include "engine/model_spec.h"
#include "engine/tensor.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::engine {
namespace {

using model_spec_internal::ElementsCapped;

constexpr absl::string_view kBoundary = "boundary";
constexpr absl::string_view kRepeat = "repeat";

struct Entry {
  bool boundary = false;
  LayerSpec layer;
};

// Holds the reader (the file name for positions); one per parse.
class SpecParser {
 public:
  explicit SpecParser(absl::string_view file) : reader_(file) {}

  absl::StatusOr<ModelSpec> Parse(const YamlValue& model) const;

 private:
  // A `model:` with from_hf: everything but the layers.
  absl::StatusOr<ModelSpec> ParseFromHf(const YamlMap& map) const;
  absl::StatusOr<std::vector<int64_t>> ParseInputShape(
      const YamlValue& value) const;
  absl::Status ParseInit(const YamlValue& value, ModelSpec& spec) const;

  // Appends the expansion of a `layers:` list to `out`. `depth` counts the
  // enclosing repeats.
  absl::Status ExpandList(const YamlValue& list, int depth,
                          std::vector<Entry>& out) const;
  absl::Status ExpandEntry(const YamlValue& item, int depth,
                           std::vector<Entry>& out) const;
  absl::Status ExpandRepeat(const YamlValue& item, int depth,
                            std::vector<Entry>& out) const;
  absl::StatusOr<LayerSpec> ParseLayer(const LayerKindRow& row,
                                       const YamlValue& options,
                                       const YamlValue& item) const;

  absl::Status CheckBoundaries(const std::vector<Entry>& entries) const;

  YamlReader reader_;
};

absl::StatusOr<std::vector<int64_t>> SpecParser::ParseInputShape(
    const YamlValue& value) const {
  if (!value.node.IsSequence() || value.node.size() == 0) {
    return reader_.Error(
        value, absl::StrCat("must be a non-empty list of positive integers "
                            "(the shape of one sample); got ",
                            DescribeYaml(value.node)));
  }
  if (value.node.size() > static_cast<size_t>(kMaxInputRank)) {
    return reader_.Error(
        value, absl::StrCat("has ", value.node.size(), " dimensions; at most ",
                            kMaxInputRank, " are supported"));
  }
  std::vector<int64_t> shape;
  for (size_t i = 0; i < value.node.size(); ++i) {
    ASSIGN_OR_RETURN(int64_t d, reader_.ParseInt(reader_.Element(value, i), 1,
                                                 kMaxModelDimension));
    shape.push_back(d);
  }
  if (ElementsCapped(shape, kMaxSampleElements) > kMaxSampleElements) {
    return reader_.Error(value,
                         absl::StrCat("has more than ", kMaxSampleElements,
                                      " elements per sample"));
  }
  return shape;
}

absl::Status SpecParser::ParseInit(const YamlValue& value,
                                   ModelSpec& spec) const {
  ASSIGN_OR_RETURN(YamlMap map, reader_.ReadMap(value, {"seed", "from"},
                                                /*null_is_empty=*/false));
  const YamlMapEntry* seed = map.Find("seed");
  const YamlMapEntry* from = map.Find("from");
  if ((seed == nullptr) == (from == nullptr)) {
    return reader_.Error(
        value,
        "give exactly one of 'seed' (an integer >= 0) or 'from' (a "
        "safetensors file)");
  }
  if (seed != nullptr) {
    ASSIGN_OR_RETURN(spec.seed, reader_.ParseUint64(seed->value));
  } else {
    const YAML::Node& node = from->value.node;
    if (!node.IsScalar() || node.Scalar().empty()) {
      return reader_.Error(
          from->value,
          absl::StrCat("must be the path of a safetensors file; got ",
                       DescribeYaml(node)));
    }
    spec.init_from = node.Scalar();
  }
  return absl::OkStatus();
}

absl::Status SpecParser::ExpandList(const YamlValue& list, int depth,
                                    std::vector<Entry>& out) const {
  if (!list.node.IsSequence() || list.node.size() == 0) {
    return reader_.Error(
        list, absl::StrCat("must be a non-empty list of layers; got ",
                           DescribeYaml(list.node)));
  }
  for (size_t i = 0; i < list.node.size(); ++i) {
    const YAML::Node item = list.node[i];
    SourceLocation where = reader_.Loc(item);
    if (where.line == 0) where = list.where;
    RETURN_IF_ERROR(ExpandEntry(
        YamlValue{item, absl::StrCat(list.path, "[", i, "]"), std::move(where)},
        depth, out));
  }
  return absl::OkStatus();
}

absl::Status SpecParser::ExpandEntry(const YamlValue& item, int depth,
                                     std::vector<Entry>& out) const {
  std::string name;
  // The options: null for a bare scalar (`- relu`), else the kind's value.
  YamlValue options;
  if (item.node.IsScalar()) {
    name = item.node.Scalar();
    options = YamlValue{YAML::Node(YAML::NodeType::Null),
                        absl::StrCat(item.path, ".", name), item.where};
  } else if (item.node.IsMap()) {
    ASSIGN_OR_RETURN(YamlMap map,
                     reader_.ReadAnyMap(item, /*null_is_empty=*/false));
    if (map.Find(kRepeat) != nullptr) return ExpandRepeat(item, depth, out);
    if (map.entries.size() != 1) {
      std::vector<std::string> keys;
      for (const YamlMapEntry& e : map.entries) keys.push_back(e.key);
      // The common cause is options written at the kind's indentation,
      // which YAML reads as sibling keys.
      return reader_.Error(
          item,
          absl::StrCat("a layer is a map with one key, its kind; "
                       "found ",
                       map.entries.size(), " keys (", absl::StrJoin(keys, ", "),
                       "): are the options indented under the kind?"));
    }
    name = map.entries[0].key;
    options = map.entries[0].value;
  } else {
    return reader_.Error(
        item, absl::StrCat("a layer must be a kind (e.g. relu) or a map "
                           "from a kind to its options (e.g. dense: "
                           "{features: 8}); got ",
                           DescribeYaml(item.node)));
  }

  if (out.size() >= static_cast<size_t>(kMaxExpandedEntries)) {
    return reader_.Error(
        item,
        absl::StrCat("the expanded layer list exceeds ", kMaxExpandedEntries,
                     " entries (layers and boundaries)"));
  }
  if (name == kBoundary) {
    RETURN_IF_ERROR(
        reader_.ReadMap(options, {}, /*null_is_empty=*/true).status());
    Entry entry;
    entry.boundary = true;
    entry.layer.path = item.path;
    entry.layer.where = item.where;
    out.push_back(std::move(entry));
    return absl::OkStatus();
  }
  if (name == kRepeat) {
    return reader_.Error(item,
                         "repeat needs a count and a body: '- repeat: 4' with "
                         "'layers: [...]' at the same indentation as 'repeat'");
  }
  const LayerKindRow* row = FindLayerKind(name);
  if (row == nullptr) {
    std::vector<absl::string_view> names;
    for (const LayerKindRow& r : LayerKindTable()) names.push_back(r.name);
    names.push_back(kBoundary);
    names.push_back(kRepeat);
    return reader_.Error(
        item, absl::StrCat("unknown layer kind '", name,
                           "'; allowed: ", absl::StrJoin(names, ", ")));
  }
  ASSIGN_OR_RETURN(LayerSpec layer, ParseLayer(*row, options, item));
  out.push_back(Entry{false, std::move(layer)});
  return absl::OkStatus();
}

absl::Status SpecParser::ExpandRepeat(const YamlValue& item, int depth,
                                      std::vector<Entry>& out) const {
  ASSIGN_OR_RETURN(
      YamlMap map,
      reader_.ReadMap(item, {"repeat", "boundary_every", "layers"}, false));
  if (depth >= kMaxRepeatNesting) {
    return reader_.Error(item, absl::StrCat("repeats nest more than ",
                                            kMaxRepeatNesting, " levels deep"));
  }
  ASSIGN_OR_RETURN(const YamlMapEntry* count_entry,
                   reader_.Require(map, "repeat"));
  ASSIGN_OR_RETURN(const int64_t count,
                   reader_.ParseInt(count_entry->value, 1, kMaxRepeatCount));
  int64_t every = 0;
  const YamlMapEntry* every_entry = map.Find("boundary_every");
  if (every_entry != nullptr) {
    ASSIGN_OR_RETURN(every, reader_.ParseInt(every_entry->value, 1, count));
  }
  ASSIGN_OR_RETURN(const YamlMapEntry* layers_entry,
                   reader_.Require(map, "layers"));

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
    return reader_.Error(
        item,
        absl::StrCat("repeat expands the layer list past ", kMaxExpandedEntries,
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

absl::StatusOr<LayerSpec> SpecParser::ParseLayer(const LayerKindRow& row,
                                                 const YamlValue& options,
                                                 const YamlValue& item) const {
  ASSIGN_OR_RETURN(
      YamlMap map,
      reader_.ReadMap(options, YamlNames(row.keys.data(), row.keys.size()),
                      /*null_is_empty=*/true));
  LayerSpec layer;
  layer.kind = row.kind;
  layer.path = item.path;
  layer.where = item.where;
  RETURN_IF_ERROR(row.parse(LayerOptions(reader_, map), layer));
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
      return YamlError(
          e.layer.where, e.layer.path,
          "a boundary cannot come first (before layer 0): the stage "
          "before it would have no layers");
    }
    if (i + 1 == entries.size()) {
      return YamlError(
          e.layer.where, e.layer.path,
          absl::StrCat("a boundary cannot come last (after layer ",
                       layers_before - 1,
                       "): the stage after it would have no layers"));
    }
    if (entries[i - 1].boundary) {
      return YamlError(e.layer.where, e.layer.path,
                       absl::StrCat("two boundaries in a row (after layer ",
                                    layers_before - 1,
                                    "): the stage between them would have no "
                                    "layers"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelSpec> SpecParser::ParseFromHf(const YamlMap& map) const {
  ModelSpec spec;
  const YamlMapEntry* from = map.Find("from_hf");
  // The checkpoint gives the layers and the weights: a job that gives them
  // too would have two answers.
  for (absl::string_view key : {"layers", "init"}) {
    if (const YamlMapEntry* e = map.Find(key); e != nullptr) {
      return YamlError(e->key_where, e->value.path,
                       absl::StrCat("a model from_hf takes its layers and "
                                    "weights from the checkpoint; remove '",
                                    key, "'"));
    }
  }
  if (!from->value.node.IsScalar() || from->value.node.Scalar().empty()) {
    return reader_.Error(
        from->value,
        absl::StrCat("must be the path of a HuggingFace checkpoint directory "
                     "(config.json and model.safetensors); got ",
                     DescribeYaml(from->value.node)));
  }
  spec.from_hf = from->value.node.Scalar();
  spec.from_hf_where = from->value.where;
  ASSIGN_OR_RETURN(const YamlMapEntry* input_shape,
                   reader_.Require(map, "input_shape"));
  ASSIGN_OR_RETURN(spec.input_shape, ParseInputShape(input_shape->value));
  if (spec.input_shape.size() != 1) {
    return reader_.Error(
        input_shape->value,
        absl::StrCat("a model from_hf takes token ids: input_shape is [seq]; "
                     "got ",
                     ShapeString(spec.input_shape)));
  }
  if (const YamlMapEntry* remat = map.Find("remat"); remat != nullptr) {
    ASSIGN_OR_RETURN(spec.remat, reader_.ParseBool(remat->value));
  }
  spec.loss = LossKind::kCrossEntropy;
  if (const YamlMapEntry* loss = map.Find("loss"); loss != nullptr) {
    RETURN_IF_ERROR(reader_.ParseEnum(loss->value, {"cross_entropy"}).status());
  }
  if (const YamlMapEntry* b = map.Find("boundaries"); b != nullptr) {
    if (!b->value.node.IsSequence()) {
      return reader_.Error(b->value,
                           absl::StrCat("must be a list of block indices where "
                                        "stages begin, e.g. [8, 16]; got ",
                                        DescribeYaml(b->value.node)));
    }
    for (size_t i = 0; i < b->value.node.size(); ++i) {
      const YamlValue element = reader_.Element(b->value, i);
      ASSIGN_OR_RETURN(const int64_t block,
                       reader_.ParseInt(element, 1, kMaxExpandedEntries));
      if (!spec.hf_boundaries.empty() && block <= spec.hf_boundaries.back()) {
        return reader_.Error(
            element, absl::StrCat("must be greater than the boundary before "
                                  "it (",
                                  spec.hf_boundaries.back(),
                                  "): stages begin at increasing blocks"));
      }
      spec.hf_boundaries.push_back(block);
    }
  }
  spec.num_stages = static_cast<int>(spec.hf_boundaries.size()) + 1;
  return spec;
}

absl::StatusOr<ModelSpec> SpecParser::Parse(const YamlValue& model) const {
  ASSIGN_OR_RETURN(YamlMap map,
                   reader_.ReadMap(model,
                                   {"input_shape", "init", "remat", "layers",
                                    "loss", "from_hf", "boundaries"},
                                   /*null_is_empty=*/false));
  if (map.Find("from_hf") != nullptr) return ParseFromHf(map);
  if (const YamlMapEntry* b = map.Find("boundaries"); b != nullptr) {
    return YamlError(b->key_where, b->value.path,
                     "boundaries cut a model from_hf; in a layer list, mark "
                     "stage boundaries with '- boundary' entries");
  }
  ModelSpec spec;

  ASSIGN_OR_RETURN(const YamlMapEntry* input_shape,
                   reader_.Require(map, "input_shape"));
  ASSIGN_OR_RETURN(spec.input_shape, ParseInputShape(input_shape->value));
  ASSIGN_OR_RETURN(const YamlMapEntry* init, reader_.Require(map, "init"));
  RETURN_IF_ERROR(ParseInit(init->value, spec));
  if (const YamlMapEntry* remat = map.Find("remat"); remat != nullptr) {
    ASSIGN_OR_RETURN(spec.remat, reader_.ParseBool(remat->value));
  }
  ASSIGN_OR_RETURN(const YamlMapEntry* loss, reader_.Require(map, "loss"));
  ASSIGN_OR_RETURN(const int loss_index,
                   reader_.ParseEnum(loss->value, {"mse", "cross_entropy"}));
  spec.loss = loss_index == 0 ? LossKind::kMse : LossKind::kCrossEntropy;
  ASSIGN_OR_RETURN(const YamlMapEntry* layers, reader_.Require(map, "layers"));

  std::vector<Entry> entries;
  RETURN_IF_ERROR(ExpandList(layers->value, /*depth=*/0, entries));
  RETURN_IF_ERROR(CheckBoundaries(entries));
  std::vector<LayerSpec> list;
  std::vector<int> stage_begin = {0};
  for (Entry& entry : entries) {
    if (entry.boundary) {
      stage_begin.push_back(static_cast<int>(list.size()));
    } else {
      list.push_back(std::move(entry.layer));
    }
  }
  RETURN_IF_ERROR(AssembleModel(std::move(list), stage_begin, &spec));
  const std::vector<int64_t>& shape = spec.output_shape;

  if (spec.loss == LossKind::kMse) {
    spec.target_shape = shape;
    spec.integer_targets = false;
  } else {
    if (shape.back() < 2) {
      return reader_.Error(
          loss->value,
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

}  // namespace

absl::StatusOr<ModelSpec> ParseModelSpec(const YAML::Node& model,
                                         absl::string_view file_name) {
  return CatchYamlExceptions(
      file_name, "the model spec", [&]() -> absl::StatusOr<ModelSpec> {
        const YamlReader reader(file_name);
        const YamlValue value{model, "model", reader.Loc(model)};
        if (!model.IsDefined()) {
          return reader.Error(value,
                              "missing: the job has no 'model:' section");
        }
        return SpecParser(file_name).Parse(value);
      });
}

absl::StatusOr<ModelSpec> ParseModelSpecYaml(absl::string_view yaml_text,
                                             absl::string_view file_name) {
  return CatchYamlExceptions(
      file_name, "the model spec", [&]() -> absl::StatusOr<ModelSpec> {
        // Like YAML::Load, only the first document: this view of a job
        // ignores whatever the job parser owns.
        ASSIGN_OR_RETURN(const YAML::Node doc,
                         LoadYaml(yaml_text, file_name, YamlDocuments::kFirst));
        const YamlReader reader(file_name);
        const SourceLocation doc_where = reader.Root(doc).where;
        if (!doc.IsMap()) {
          return YamlError(
              doc_where, "(top level)",
              absl::StrCat("must be a map with a 'model' key; got ",
                           DescribeYaml(doc)));
        }
        std::optional<YamlValue> model;
        for (auto it = doc.begin(); it != doc.end(); ++it) {
          const YAML::Node key = it->first;
          const YAML::Node value = it->second;
          if (!key.IsScalar() || key.Scalar() != "model") continue;
          const SourceLocation key_where = reader.Loc(key);
          if (model.has_value()) {
            return YamlError(key_where, "(top level)", "duplicate key 'model'");
          }
          model = YamlValue{value, "model",
                            value.IsNull() ? key_where : reader.Loc(value)};
        }
        if (!model.has_value()) {
          return YamlError(doc_where, "(top level)",
                           "missing required key 'model'");
        }
        return SpecParser(file_name).Parse(*model);
      });
}

}  // namespace conveyor::engine
