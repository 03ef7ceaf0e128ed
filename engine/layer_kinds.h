// The layer-kind table: every kind a model spec may name, each in one row
// that gives its YAML name and keys, how its options are read, its shape
// inference and parameters, and how the engine builds it. Adding a kind is a
// LayerKind value (engine/layer_spec.h), the fields its options need in
// LayerSpec, one row in the engine/layer_kinds_*.cc of its model family
// (listed in the table in engine/layer_kinds.cc), and the row's example,
// which tests/engine/layer_kinds_test.cc parses, builds and checks against
// the parameters the row declares.
//
// The model spec (engine/model_spec.h) runs the rows while it parses; the
// stage (engine/stage.h) builds layers through BuildLayer. Thread-safe: the
// table is constant.
#ifndef CONVEYOR_ENGINE_LAYER_KINDS_H_
#define CONVEYOR_ENGINE_LAYER_KINDS_H_

#include <initializer_list>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/yaml_reader.h"
#include "engine/backend.h"
#include "engine/layer.h"
#include "engine/layer_spec.h"
#include "engine/tensor_parallel.h"

namespace conveyor::engine {

// A kind's options: the YAML map under its name, with unknown keys already
// refused. Each reader leaves its field as it is when the key is absent
// (the row sets defaults first) and reports a bad value at its position.
class LayerOptions {
 public:
  LayerOptions(const YamlReader& reader, const YamlMap& map)
      : reader_(reader), map_(map) {}

  // An integer in [min, kMaxModelDimension]; `required` refuses its absence.
  absl::Status Dim(absl::string_view key, bool required, int64_t min,
                   int64_t& field) const;
  absl::Status Flag(absl::string_view key, bool& field) const;
  // A number > 0 and <= max.
  absl::Status Positive(absl::string_view key, double max, double& field) const;
  // One of `names`; sets `index` to its position.
  absl::Status Enum(absl::string_view key,
                    std::initializer_list<absl::string_view> names,
                    int& index) const;

  const YamlReader& reader() const { return reader_; }
  const YamlMap& map() const { return map_; }

 private:
  const YamlReader& reader_;
  const YamlMap& map_;
};

// InvalidArgument "file:line:col: path: <kind> (layer <i>): <message>", for
// a layer that cannot take its input or options.
absl::Status LayerError(const LayerSpec& layer, absl::string_view message);

struct LayerKindRow {
  LayerKind kind;
  // The YAML name.
  absl::string_view name;
  // The option keys it accepts (none for a bare kind such as relu).
  std::span<const absl::string_view> keys;
  // Sets the kind's defaults in `layer`, then reads the options.
  absl::Status (*parse)(const LayerOptions& options, LayerSpec& layer);
  // With layer.input_shape set and layer.output_shape equal to it: resolves
  // what depends on the input, and fills output_shape and params (names
  // "layers.<index>.<...>", in PyTorch's registration order; the built
  // layer has the same names and shapes, perhaps listed in another order).
  absl::Status (*infer)(LayerSpec& layer);
  // The engine's layer, with the parameters `infer` declared.
  absl::StatusOr<std::unique_ptr<Layer>> (*build)(Backend* backend,
                                                  const LayerSpec& layer);
  // A layer list entry and an input shape it takes, for docs and the
  // table's own test: "- dense: {features: 8}" on "[4, 6]".
  absl::string_view example;
  absl::string_view example_input;
  // For kinds that split over a tensor-parallel group (engine/
  // tensor_parallel.h): the layer's shard on one rank (its parameters
  // under their global names, each the spec's shape or that shape with one
  // dimension divided by the group's size), and why `layer` cannot split
  // over `ranks` (InvalidArgument at the layer) or OK. Null for kinds that
  // run whole on every rank.
  absl::StatusOr<std::unique_ptr<Layer>> (*build_shard)(
      Backend* backend, const LayerSpec& layer,
      const TensorParallelRank& rank) = nullptr;
  absl::Status (*check_shard)(const LayerSpec& layer, int64_t ranks) = nullptr;
  // For a split parameter of this kind (by global name): how many equal
  // blocks its split dimension stacks, each split alike (q, k and v in one
  // in_proj: 3). Null: 1.
  int64_t (*shard_blocks)(absl::string_view name) = nullptr;
};

// Every kind, in the order an unknown kind's error lists them.
std::span<const LayerKindRow> LayerKindTable();

// The row of `name`, or nullptr.
const LayerKindRow* FindLayerKind(absl::string_view name);
// The row of `kind` (every LayerKind has one).
const LayerKindRow& LayerKindRowOf(LayerKind kind);
// The YAML name: "dense", "relu", ...
absl::string_view LayerKindName(LayerKind kind);

// Gives a tied lm_head (`head.tied`, inferred) its one parameter: a tied
// copy of the weight of `first`, the model's first layer (nullptr when the
// head is itself the first), which must be an embedding of the head's
// vocabulary and width. InvalidArgument at the head otherwise.
absl::Status TieToEmbedding(const LayerSpec* first, LayerSpec& head);

// Builds `layer` on `backend` (its row's build), or its shard on `rank` of a
// tensor-parallel group (build_shard) for a kind that splits.
absl::StatusOr<std::unique_ptr<Layer>> BuildLayer(
    Backend* backend, const LayerSpec& layer,
    const TensorParallelRank& rank = {});

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYER_KINDS_H_
