// The layer-kind table: every LayerKind has one row, names are unique, and
// each row's example parses through the model spec, builds, has exactly the
// parameters (names and shapes) its row declared, and maps an input
// of the example's shape to the output shape the row inferred.
#include "engine/layer_kinds.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_spec.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

TEST(LayerKindsTest, EveryKindHasOneRowWithAUniqueName) {
  std::set<absl::string_view> names;
  for (int k = 0; k <= static_cast<int>(LayerKind::kDelay); ++k) {
    const LayerKind kind = static_cast<LayerKind>(k);
    const LayerKindRow& row = LayerKindRowOf(kind);
    EXPECT_EQ(row.kind, kind);
    EXPECT_TRUE(names.insert(row.name).second) << row.name;
    EXPECT_EQ(FindLayerKind(row.name), &row);
    EXPECT_EQ(LayerKindName(kind), row.name);
  }
  EXPECT_EQ(names.size(), LayerKindTable().size());
  EXPECT_EQ(FindLayerKind("boundary"), nullptr);
  EXPECT_EQ(FindLayerKind("Dense"), nullptr);
}

TEST(LayerKindsTest, EachExampleBuildsTheLayerItsRowDeclares) {
  Backend* cpu = CpuBackend::Get();
  for (const LayerKindRow& row : LayerKindTable()) {
    SCOPED_TRACE(row.example);
    const std::string yaml = absl::StrCat(
        "model:\n  input_shape: ", row.example_input,
        "\n  init: {seed: 1}\n  loss: mse\n  layers:\n    ", row.example, "\n");
    auto spec = ParseModelSpecYaml(yaml, "example.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_EQ(spec->layers.size(), 1u);
    const LayerSpec& layer = spec->layers[0];
    EXPECT_EQ(layer.kind, row.kind);
    auto built = BuildLayer(cpu, layer);
    ASSERT_TRUE(built.ok()) << built.status();
    // By name: the row lists them in PyTorch's registration order, which
    // a composite may not follow (a pre-norm block runs norm1 before attn);
    // stages match them by name.
    std::map<std::string, Shape> declared, built_params;
    for (const ParamSpec& p : layer.params) declared[p.name] = p.shape;
    for (Parameter* p : (*built)->parameters()) {
      built_params[p->name] = p->value.shape();
    }
    EXPECT_EQ(built_params, declared);
    EXPECT_EQ(declared.size(), layer.params.size());  // no name twice
    Shape input = {2};
    input.insert(input.end(), layer.input_shape.begin(),
                 layer.input_shape.end());
    Tensor x = spec->token_input
                   ? testing_util::Ids(input, std::vector<int64_t>(
                                                  2 * layer.input_shape[0], 0))
                   : testing_util::RandomTensor(input, 3);
    Stash stash;
    auto y = (*built)->Forward(x, stash);
    ASSERT_TRUE(y.ok()) << y.status();
    Shape output = {2};
    output.insert(output.end(), layer.output_shape.begin(),
                  layer.output_shape.end());
    EXPECT_EQ(y->shape(), output);
  }
}

TEST(LayerKindsTest, LayerErrorNamesTheKindAndTheLayer) {
  LayerSpec layer;
  layer.kind = LayerKind::kRmsNorm;
  layer.index = 3;
  layer.path = "model.layers[4]";
  layer.where = {"job.yaml", 9, 7};
  EXPECT_EQ(LayerError(layer, "bad").message(),
            "job.yaml:9:7: model.layers[4]: rmsnorm (layer 3): bad");
}

}  // namespace
}  // namespace conveyor::engine
