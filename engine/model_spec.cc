#include "engine/model_spec.h"

#include <cmath>
#include <cstdint>
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
#include "yaml-cpp/yaml.h"

namespace conveyor::engine {
namespace {

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
    {LayerKind::kRmsNorm, "rmsnorm"},
    {LayerKind::kLlamaBlock, "llama_block"},
    {LayerKind::kDelay, "delay"},
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

// HF's Llama init: every Linear weight N(0, initializer_range^2) with the
// default initializer_range of 0.02, norm weights ones.
constexpr double kLlamaInitStd = 0.02;

void AddLlamaBlockParams(absl::string_view prefix, const LayerSpec& layer,
                         int64_t d, std::vector<ParamSpec>& params) {
  const int64_t kv = layer.kv_heads * (d / layer.heads);
  auto linear = [&](absl::string_view name, int64_t out, int64_t in) {
    params.push_back(
        MakeParam(prefix, name, {out, in}, ParamInit::kNormal, kLlamaInitStd));
  };
  auto bias = [&](absl::string_view name, int64_t out) {
    if (layer.bias) {
      params.push_back(MakeParam(prefix, name, {out}, ParamInit::kZeros, 0.0));
    }
  };
  params.push_back(
      MakeParam(prefix, "input_layernorm.weight", {d}, ParamInit::kOnes, 0.0));
  linear("self_attn.q_proj.weight", d, d);
  bias("self_attn.q_proj.bias", d);
  linear("self_attn.k_proj.weight", kv, d);
  bias("self_attn.k_proj.bias", kv);
  linear("self_attn.v_proj.weight", kv, d);
  bias("self_attn.v_proj.bias", kv);
  linear("self_attn.o_proj.weight", d, d);
  params.push_back(MakeParam(prefix, "post_attention_layernorm.weight", {d},
                             ParamInit::kOnes, 0.0));
  linear("mlp.gate_proj.weight", layer.mlp_features, d);
  linear("mlp.up_proj.weight", layer.mlp_features, d);
  linear("mlp.down_proj.weight", d, layer.mlp_features);
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
  absl::StatusOr<LayerSpec> ParseLayer(LayerKind kind, const YamlValue& options,
                                       const YamlValue& item) const;

  // The options of a `delay` layer (`map`, already checked for unknown keys).
  absl::Status ParseDelay(const YamlMap& map, LayerSpec& layer) const;

  absl::Status CheckBoundaries(const std::vector<Entry>& entries) const;
  absl::Status InferLayer(LayerSpec& layer) const;
  absl::Status LayerError(const LayerSpec& layer,
                          absl::string_view message) const {
    return YamlError(layer.where, layer.path,
                     absl::StrCat(LayerKindName(layer.kind), " (layer ",
                                  layer.index, "): ", message));
  }

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
  const KindName* kind = nullptr;
  for (const KindName& k : kKindNames) {
    if (k.name == name) kind = &k;
  }
  if (kind == nullptr) {
    std::vector<absl::string_view> names;
    for (const KindName& k : kKindNames) names.push_back(k.name);
    names.push_back(kBoundary);
    names.push_back(kRepeat);
    return reader_.Error(
        item, absl::StrCat("unknown layer kind '", name,
                           "'; allowed: ", absl::StrJoin(names, ", ")));
  }
  ASSIGN_OR_RETURN(LayerSpec layer, ParseLayer(kind->kind, options, item));
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

absl::StatusOr<LayerSpec> SpecParser::ParseLayer(LayerKind kind,
                                                 const YamlValue& options,
                                                 const YamlValue& item) const {
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
  static constexpr absl::string_view kRmsNormKeys[] = {"eps"};
  static constexpr absl::string_view kLlamaBlockKeys[] = {
      "heads", "kv_heads",   "mlp_features",
      "eps",   "rope_theta", "attention_bias"};
  static constexpr absl::string_view kDelayKeys[] = {
      "forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms"};
  YamlNames keys;  // relu: none
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
    case LayerKind::kRmsNorm:
      keys = kRmsNormKeys;
      break;
    case LayerKind::kLlamaBlock:
      keys = kLlamaBlockKeys;
      break;
    case LayerKind::kDelay:
      keys = kDelayKeys;
      break;
  }
  ASSIGN_OR_RETURN(YamlMap map,
                   reader_.ReadMap(options, keys, /*null_is_empty=*/true));

  LayerSpec layer;
  layer.kind = kind;
  layer.path = item.path;
  layer.where = item.where;
  if (kind == LayerKind::kLmHead || kind == LayerKind::kLlamaBlock) {
    layer.bias = false;
  }
  // HF's LlamaRMSNorm default.
  if (kind == LayerKind::kRmsNorm || kind == LayerKind::kLlamaBlock) {
    layer.eps = 1e-6;
  }

  // Every option is optional here; Require() below enforces the required
  // ones per kind. Unknown keys were rejected by ReadMap.
  auto dim = [&](absl::string_view key, bool required, int64_t min,
                 int64_t& field) -> absl::Status {
    const YamlMapEntry* e = map.Find(key);
    if (e == nullptr) {
      if (required) return reader_.Require(map, key).status();
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(field,
                     reader_.ParseInt(e->value, min, kMaxModelDimension));
    return absl::OkStatus();
  };
  auto flag = [&](absl::string_view key, bool& field) -> absl::Status {
    if (const YamlMapEntry* e = map.Find(key); e != nullptr) {
      ASSIGN_OR_RETURN(field, reader_.ParseBool(e->value));
    }
    return absl::OkStatus();
  };
  auto approximate = [&]() -> absl::Status {
    if (const YamlMapEntry* e = map.Find("approximate"); e != nullptr) {
      ASSIGN_OR_RETURN(const int i,
                       reader_.ParseEnum(e->value, {"none", "tanh"}));
      layer.approximate_tanh = i == 1;
    }
    return absl::OkStatus();
  };
  auto eps = [&]() -> absl::Status {
    if (const YamlMapEntry* e = map.Find("eps"); e != nullptr) {
      ASSIGN_OR_RETURN(layer.eps, reader_.ParsePositiveDouble(e->value));
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
      if (const YamlMapEntry* e = map.Find("norm"); e != nullptr) {
        ASSIGN_OR_RETURN(const int i,
                         reader_.ParseEnum(e->value, {"post", "pre"}));
        layer.pre_norm = i == 1;
      }
      RETURN_IF_ERROR(eps());
      RETURN_IF_ERROR(approximate());
      break;
    case LayerKind::kLmHead:
      RETURN_IF_ERROR(dim("vocab_size", true, 1, layer.vocab_size));
      RETURN_IF_ERROR(flag("bias", layer.bias));
      break;
    case LayerKind::kRmsNorm:
      RETURN_IF_ERROR(eps());
      break;
    case LayerKind::kLlamaBlock:
      RETURN_IF_ERROR(dim("heads", true, 1, layer.heads));
      RETURN_IF_ERROR(dim("kv_heads", false, 1, layer.kv_heads));
      if (layer.kv_heads == 0) layer.kv_heads = layer.heads;
      RETURN_IF_ERROR(dim("mlp_features", true, 1, layer.mlp_features));
      RETURN_IF_ERROR(eps());
      if (const YamlMapEntry* e = map.Find("rope_theta"); e != nullptr) {
        ASSIGN_OR_RETURN(layer.rope_theta,
                         reader_.ParsePositiveDouble(e->value));
        // The kernels take it as a float.
        if (layer.rope_theta > 1e30) {
          return reader_.Error(e->value,
                               absl::StrCat("must be at most 1e30; got ",
                                            DescribeYaml(e->value.node)));
        }
      }
      RETURN_IF_ERROR(flag("attention_bias", layer.bias));
      break;
    case LayerKind::kDelay:
      RETURN_IF_ERROR(ParseDelay(map, layer));
      break;
  }
  return layer;
}

absl::Status SpecParser::ParseDelay(const YamlMap& map,
                                    LayerSpec& layer) const {
  auto millis = [&](const YamlMapEntry& e) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(const double ms, reader_.ParseNonNegativeDouble(e.value));
    if (ms > kMaxDelayMs) {
      return reader_.Error(
          e.value,
          absl::StrCat("must be at most ", kMaxDelayMs, " (one minute); got ",
                       DescribeYaml(e.value.node)));
    }
    return ms;
  };
  ASSIGN_OR_RETURN(const YamlMapEntry* forward,
                   reader_.Require(map, "forward_ms"));
  ASSIGN_OR_RETURN(layer.forward_ms, millis(*forward));
  const YamlMapEntry* backward = map.Find("backward_ms");
  const YamlMapEntry* input = map.Find("backward_input_ms");
  const YamlMapEntry* weight = map.Find("backward_weight_ms");
  // The backward is given whole or split, never both: with both, which one
  // B costs would be a guess.
  if (backward != nullptr && (input != nullptr || weight != nullptr)) {
    const YamlMapEntry& split = input != nullptr ? *input : *weight;
    return YamlError(split.key_where, split.value.path,
                     "give either backward_ms or the split backward "
                     "(backward_input_ms and backward_weight_ms), not both");
  }
  if (backward != nullptr) {
    ASSIGN_OR_RETURN(layer.backward_input_ms, millis(*backward));
    layer.backward_weight_ms = 0.0;
    return absl::OkStatus();
  }
  if (input == nullptr && weight == nullptr) {
    return reader_.Error(map.self,
                         "missing required key 'backward_ms' (or "
                         "backward_input_ms and backward_weight_ms for a split "
                         "backward)");
  }
  if (input == nullptr || weight == nullptr) {
    return reader_.Error(
        map.self,
        absl::StrCat(
            "a split backward needs both backward_input_ms and "
            "backward_weight_ms; missing '",
            input == nullptr ? "backward_input_ms" : "backward_weight_ms",
            "'"));
  }
  ASSIGN_OR_RETURN(layer.backward_input_ms, millis(*input));
  ASSIGN_OR_RETURN(layer.backward_weight_ms, millis(*weight));
  return absl::OkStatus();
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
    case LayerKind::kDelay:  // Identity: no parameters, same shape.
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
    case LayerKind::kRmsNorm:
      params.push_back(MakeParam(prefix, "weight", {d}, ParamInit::kOnes, 0.0));
      break;
    case LayerKind::kLlamaBlock: {
      RETURN_IF_ERROR(needs_sequence());
      if (d % layer.heads != 0 || (d / layer.heads) % 2 != 0) {
        return LayerError(
            layer, absl::StrCat("the input's features (", d,
                                ") must split into heads = ", layer.heads,
                                " of an even head size (rotary embedding "
                                "turns pairs)"));
      }
      if (layer.heads % layer.kv_heads != 0) {
        return LayerError(layer,
                          absl::StrCat("kv_heads = ", layer.kv_heads,
                                       " does not divide heads = ", layer.heads,
                                       " (each key/value head serves a whole "
                                       "group of query heads)"));
      }
      layer.qkv_features = d;
      layer.causal = true;
      AddLlamaBlockParams(prefix, layer, d, params);
      break;
    }
  }
  if (ElementsCapped(out, kMaxSampleElements) > kMaxSampleElements) {
    return LayerError(
        layer, absl::StrCat("its output ", ShapeString(out), " has more than ",
                            kMaxSampleElements, " elements per sample"));
  }
  layer.output_shape = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<ModelSpec> SpecParser::Parse(const YamlValue& model) const {
  ASSIGN_OR_RETURN(
      YamlMap map,
      reader_.ReadMap(model, {"input_shape", "init", "remat", "layers", "loss"},
                      /*null_is_empty=*/false));
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

absl::Status SetStageBoundaries(ModelSpec* model,
                                const std::vector<int>& stage_begin) {
  const int num_layers = static_cast<int>(model->layers.size());
  if (stage_begin.empty()) {
    return absl::InvalidArgumentError("stage boundaries: no stages");
  }
  if (stage_begin[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage boundaries: the first stage begins at layer ",
                     stage_begin[0], ", not 0"));
  }
  if (static_cast<int64_t>(stage_begin.size()) > num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage boundaries: ", stage_begin.size(),
                     " stages for a model of ", num_layers, " layers"));
  }
  for (size_t s = 1; s < stage_begin.size(); ++s) {
    if (stage_begin[s] <= stage_begin[s - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage boundaries: stage ", s, " begins at layer ", stage_begin[s],
          ", not after stage ", s - 1, " (layer ", stage_begin[s - 1], ")"));
    }
    if (stage_begin[s] >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage boundaries: stage ", s, " begins at layer ", stage_begin[s],
          " but the model has ", num_layers, " layers"));
    }
  }
  model->stage_begin = stage_begin;
  model->num_stages = static_cast<int>(stage_begin.size());
  for (int s = 0; s < model->num_stages; ++s) {
    for (int i = stage_begin[s]; i < model->StageEnd(s); ++i) {
      model->layers[i].stage = s;
    }
  }
  return absl::OkStatus();
}

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
