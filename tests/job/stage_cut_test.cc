#include "job/stage_cut.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::job {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(StageCutTest, KnowsEachLayersStage) {
  absl::StatusOr<StageCut> cut = StageCut::Create({0, 2, 5}, 7);
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->num_stages(), 3);
  EXPECT_EQ(cut->num_layers(), 7);
  std::vector<int> stages;
  for (int l = 0; l < 7; ++l) stages.push_back(cut->StageOf(l));
  EXPECT_THAT(stages, ElementsAre(0, 0, 1, 1, 1, 2, 2));
  EXPECT_EQ(cut->Begin(1), 2);
  EXPECT_EQ(cut->End(1), 5);
  EXPECT_EQ(cut->End(2), 7);
  EXPECT_EQ(cut->ToString(), "0, 2, 5");
}

TEST(StageCutTest, RefusesWhatIsNotACut) {
  struct Case {
    std::vector<int> first;
    int layers;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {{}, 3, "no stages"},
           {{1, 2}, 3, "the first stage begins at layer 1, not 0"},
           {{0, 2, 2}, 4, "stage 2 begins at layer 2, not after stage 1"},
           {{0, 1, 3}, 3, "stage 2 begins at layer 3 but the model has 3"},
           {{0, 1, 2, 3}, 3, "4 stages for a model of 3 layers"}}) {
    absl::StatusOr<StageCut> cut = StageCut::Create(c.first, c.layers);
    ASSERT_FALSE(cut.ok()) << c.says;
    EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(cut.status().message(), HasSubstr(c.says));
  }
}

engine::ModelSpec SixLayers() {
  absl::StatusOr<engine::ModelSpec> model =
      engine::ParseModelSpecYaml(R"(
model:
  input_shape: [4]
  init: {seed: 1}
  layers:
    - dense: {features: 4}
    - relu
    - dense: {features: 4}
    - boundary
    - relu
    - dense: {features: 4}
    - relu
  loss: mse
)",
                                 "m.yaml");
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : engine::ModelSpec();
}

TEST(StageCutTest, AppliesToAModelAndReadsItBack) {
  engine::ModelSpec model = SixLayers();
  ASSERT_EQ(model.layers.size(), 6u);
  EXPECT_THAT(StageCut::Of(model).first_layers(), ElementsAre(0, 3));
  const std::vector<std::string> names = [&] {
    std::vector<std::string> n;
    for (const engine::LayerSpec& l : model.layers) {
      for (const engine::ParamSpec& p : l.params) n.push_back(p.name);
    }
    return n;
  }();
  absl::StatusOr<StageCut> cut = StageCut::Create({0, 1, 4}, 6);
  ASSERT_TRUE(cut.ok());
  ASSERT_TRUE(cut->ApplyTo(&model).ok());
  EXPECT_EQ(model.num_stages, 3);
  EXPECT_EQ(StageCut::Of(model), *cut);
  for (int l = 0; l < 6; ++l) EXPECT_EQ(model.layers[l].stage, cut->StageOf(l));
  // Parameter names follow the layer, not the stage.
  std::vector<std::string> after;
  for (const engine::LayerSpec& l : model.layers) {
    for (const engine::ParamSpec& p : l.params) after.push_back(p.name);
  }
  EXPECT_EQ(after, names);
  // A cut of another model is refused and changes nothing.
  absl::StatusOr<StageCut> other = StageCut::Create({0, 1}, 5);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->ApplyTo(&model).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StageCut::Of(model), *cut);
}

}  // namespace
}  // namespace conveyor::job
