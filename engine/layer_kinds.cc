// The layer-kind table (engine/layer_kinds.h): the rows in their order, the
// lookups over them, the options reader the rows parse with, and the tying
// of an lm_head to the embedding. The rows themselves live by model family
// in engine/layer_kinds_{basic,transformer,llama}.cc.
#include "engine/layer_kinds.h"

#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "engine/internal/layer_kind_rows.h"

namespace conveyor::engine {
namespace {

using layer_kinds_internal::Features;

// Every kind, in the order an unknown kind's error lists them. Made on first
// use (a function-local static, so thread-safe) from the rows, which are
// defined in other files.
std::span<const LayerKindRow> Rows() {
  namespace lk = layer_kinds_internal;
  static const LayerKindRow kRows[] = {
      lk::DenseRow(),
      lk::ReluRow(),
      lk::GeluRow(),
      lk::LayerNormRow(),
      lk::EmbeddingRow(),
      lk::AttentionRow(),
      lk::TransformerBlockRow(),
      lk::LmHeadRow(),
      lk::RmsNormRow(),
      lk::LlamaBlockRow(),
      lk::DelayRow(),
  };
  return kRows;
}

}  // namespace

absl::Status LayerOptions::Dim(absl::string_view key, bool required,
                               int64_t min, int64_t& field) const {
  const YamlMapEntry* e = map_.Find(key);
  if (e == nullptr) {
    if (required) return reader_.Require(map_, key).status();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(field, reader_.ParseInt(e->value, min, kMaxModelDimension));
  return absl::OkStatus();
}

absl::Status LayerOptions::Flag(absl::string_view key, bool& field) const {
  if (const YamlMapEntry* e = map_.Find(key); e != nullptr) {
    ASSIGN_OR_RETURN(field, reader_.ParseBool(e->value));
  }
  return absl::OkStatus();
}

absl::Status LayerOptions::Positive(absl::string_view key, double max,
                                    double& field) const {
  const YamlMapEntry* e = map_.Find(key);
  if (e == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const double value, reader_.ParsePositiveDouble(e->value));
  if (value > max) {
    return reader_.Error(e->value,
                         absl::StrCat("must be at most ", max, "; got ",
                                      DescribeYaml(e->value.node)));
  }
  field = value;
  return absl::OkStatus();
}

absl::Status LayerOptions::Enum(absl::string_view key,
                                std::initializer_list<absl::string_view> names,
                                int& index) const {
  if (const YamlMapEntry* e = map_.Find(key); e != nullptr) {
    ASSIGN_OR_RETURN(index, reader_.ParseEnum(e->value, names));
  }
  return absl::OkStatus();
}

absl::Status LayerError(const LayerSpec& layer, absl::string_view message) {
  return YamlError(layer.where, layer.path,
                   absl::StrCat(LayerKindName(layer.kind), " (layer ",
                                layer.index, "): ", message));
}

std::span<const LayerKindRow> LayerKindTable() { return Rows(); }

const LayerKindRow* FindLayerKind(absl::string_view name) {
  for (const LayerKindRow& row : Rows()) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

const LayerKindRow& LayerKindRowOf(LayerKind kind) {
  for (const LayerKindRow& row : Rows()) {
    if (row.kind == kind) return row;
  }
  CONVEYOR_CHECK(false, "a layer kind without a row in the table");
  return Rows()[0];
}

absl::string_view LayerKindName(LayerKind kind) {
  return LayerKindRowOf(kind).name;
}

absl::Status TieToEmbedding(const LayerSpec* first, LayerSpec& head) {
  if (first == nullptr) {
    return LayerError(
        head,
        "tied: true shares the weight of an embedding, and the model "
        "must begin with one; it begins with this lm_head");
  }
  if (first->kind != LayerKind::kEmbedding) {
    return LayerError(
        head, absl::StrCat("tied: true shares the weight of the embedding the "
                           "model begins with, but its first layer is a ",
                           LayerKindName(first->kind)));
  }
  if (first->vocab_size != head.vocab_size) {
    return LayerError(head, absl::StrCat("tied: true needs the embedding's "
                                         "vocabulary, but vocab_size is ",
                                         head.vocab_size, " here and ",
                                         first->vocab_size, " there"));
  }
  if (first->features != Features(head)) {
    return LayerError(head,
                      absl::StrCat("tied: true needs an input as wide as the "
                                   "embedding's output (",
                                   first->features, " features); this one has ",
                                   Features(head)));
  }
  // The embedding's weight [vocab, features] is also the Linear weight
  // [out, in] the head multiplies by.
  ParamSpec copy = first->params.at(0);
  copy.tied_copy = true;
  head.params = {std::move(copy)};
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Layer>> BuildLayer(
    Backend* backend, const LayerSpec& layer, const TensorParallelRank& rank) {
  const LayerKindRow& row = LayerKindRowOf(layer.kind);
  if (rank.size() > 1 && row.build_shard != nullptr) {
    return row.build_shard(backend, layer, rank);
  }
  return row.build(backend, layer);
}

}  // namespace conveyor::engine
