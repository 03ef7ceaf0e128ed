// llama_block's head_dim and rope_scaling keys (engine/layer_kinds_llama.cc):
// what they resolve to, the parameters and FLOPs a head size other than
// features / heads gives, and each bad value refused at its file:line:col.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model_spec.h"
#include "engine/rope.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

// A model of one llama_block with `options` on [seq 6, features].
std::string Job(absl::string_view options, int features) {
  return absl::StrCat(
      "model:\n  input_shape: [6, ", features,
      "]\n  init: {seed: 0}\n  loss: mse\n"
      "  layers:\n    - llama_block: {heads: 2, mlp_features: 12",
      options, "}\n");
}

absl::StatusOr<ModelSpec> Parse(absl::string_view options, int features = 8) {
  return ParseModelSpecYaml(Job(options, features), "job.yaml");
}

std::string Error(absl::string_view options, int features = 8) {
  absl::StatusOr<ModelSpec> spec = Parse(options, features);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
      << spec.status();
  return std::string(spec.status().message());
}

TEST(LlamaBlockKeysTest, HeadDimDefaultsToFeaturesOverHeads) {
  absl::StatusOr<ModelSpec> spec = Parse("");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->layers[0].head_dim, 4);
  EXPECT_EQ(spec->layers[0].qkv_features, 8);
  EXPECT_EQ(spec->layers[0].rope_scaling, RopeScaling{});
}

TEST(LlamaBlockKeysTest, HeadDimSizesTheProjectionsAndTheFlops) {
  // 2 heads of 6 on 8 features, 1 key/value head: q [12, 8], k and v
  // [6, 8], o [8, 12].
  absl::StatusOr<ModelSpec> spec = Parse(", kv_heads: 1, head_dim: 6");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const LayerSpec& l = spec->layers[0];
  EXPECT_EQ(l.head_dim, 6);
  EXPECT_EQ(l.qkv_features, 12);
  std::vector<std::vector<int64_t>> shapes;
  for (const ParamSpec& p : l.params) shapes.push_back(p.shape);
  using S = std::vector<int64_t>;
  EXPECT_THAT(shapes,
              ::testing::ElementsAre(S{8}, S{12, 8}, S{6, 8}, S{6, 8}, S{8, 12},
                                     S{8}, S{12, 8}, S{12, 8}, S{8, 12}));
  // 2 FLOPs per weight per position, plus 4 s^2 (heads * head_dim) for the
  // scores and the weighted sum; backward twice the forward.
  const double weights = 12 * 8 + 6 * 8 + 6 * 8 + 8 * 12 + 3 * 12 * 8;
  EXPECT_DOUBLE_EQ(spec->TrainingFlopsPerSample(),
                   3 * (2 * weights * 6 + 4.0 * 6 * 6 * 12));
}

TEST(LlamaBlockKeysTest, RopeScalingTakesHfKeys) {
  absl::StatusOr<ModelSpec> spec = Parse(
      ", rope_theta: 500000, rope_scaling: {rope_type: llama3, factor: 32, "
      "low_freq_factor: 1, high_freq_factor: 4, "
      "original_max_position_embeddings: 8192}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->layers[0].rope_scaling,
            (RopeScaling{.type = RopeType::kLlama3,
                         .factor = 32,
                         .original_max_position_embeddings = 8192,
                         .low_freq_factor = 1,
                         .high_freq_factor = 4}));
  spec = Parse(
      ", rope_scaling: {rope_type: yarn, factor: 4, "
      "original_max_position_embeddings: 32, beta_fast: 16, "
      "attention_factor: 1.2, truncate: false}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const RopeScaling& yarn = spec->layers[0].rope_scaling;
  EXPECT_EQ(yarn.type, RopeType::kYarn);
  EXPECT_EQ(yarn.beta_fast, 16);
  EXPECT_EQ(yarn.beta_slow, 1);  // HF's default
  EXPECT_EQ(yarn.attention_factor, 1.2);
  EXPECT_FALSE(yarn.truncate);
  spec = Parse(", rope_scaling: {rope_type: default}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->layers[0].rope_scaling, RopeScaling{});
}

TEST(LlamaBlockKeysTest, BadHeadDimIsRefusedAtItsPosition) {
  EXPECT_EQ(Error(", head_dim: 5"),
            "job.yaml:6:59: model.layers[0].llama_block.head_dim: must be "
            "even (rotary embedding turns pairs of features); got 5");
  EXPECT_THAT(Error(", head_dim: 0"),
              ::testing::StartsWith(
                  "job.yaml:6:59: model.layers[0].llama_block.head_dim: "));
  EXPECT_THAT(Error(", head_dim: 8388610"),
              ::testing::HasSubstr("heads * head_dim = 16777220 is more than "
                                   "16777216"));
}

TEST(LlamaBlockKeysTest, BadRopeScalingIsRefusedAtItsKey) {
  EXPECT_EQ(Error(", rope_scaling: {rope_type: longrope}"),
            "job.yaml:6:75: model.layers[0].llama_block.rope_scaling."
            "rope_type: must be one of: default, linear, dynamic, yarn, "
            "llama3; got 'longrope'");
  EXPECT_EQ(Error(", rope_scaling: {factor: 2}"),
            "job.yaml:6:63: model.layers[0].llama_block.rope_scaling: "
            "missing required key 'rope_type'");
  EXPECT_EQ(Error(", rope_scaling: {rope_type: linear}"),
            "job.yaml:6:63: model.layers[0].llama_block.rope_scaling: "
            "missing required key 'factor'");
  EXPECT_EQ(Error(", rope_scaling: {rope_type: linear, factor: 0.5}"),
            "job.yaml:6:91: model.layers[0].llama_block.rope_scaling.factor: "
            "must be a finite number >= 1 for rope_type linear; got 0.5");
  EXPECT_EQ(Error(", rope_scaling: {rope_type: linear, factor: 2, "
                  "low_freq_factor: 1}"),
            "job.yaml:6:94: model.layers[0].llama_block.rope_scaling."
            "low_freq_factor: not a key of rope_type linear; its keys: "
            "rope_type, factor");
  EXPECT_EQ(Error(", rope_scaling: {rope_type: llama3, factor: 8, "
                  "low_freq_factor: 4, high_freq_factor: 2, "
                  "original_max_position_embeddings: 64}"),
            "job.yaml:6:132: model.layers[0].llama_block.rope_scaling."
            "high_freq_factor: must be finite and more than low_freq_factor "
            "(4); got 2");
  EXPECT_THAT(Error(", rope_scaling: {rope_type: dynamic, factor: 2}"),
              ::testing::HasSubstr(
                  "missing required key 'original_max_position_embeddings'"));
  // A limit that depends on another option is reported at that option.
  EXPECT_EQ(Error(", rope_theta: 1, rope_scaling: {rope_type: yarn, "
                  "factor: 2, original_max_position_embeddings: 8}"),
            "job.yaml:6:61: model.layers[0].llama_block.rope_theta: must be "
            "more than 1 for rope_type yarn; got 1");
  EXPECT_EQ(Error(", head_dim: 2, rope_scaling: {rope_type: dynamic, "
                  "factor: 2, original_max_position_embeddings: 8}"),
            "job.yaml:6:59: model.layers[0].llama_block.head_dim: must be "
            "more than 2 for rope_type dynamic; got 2");
  // One that depends on the head size features / heads, at the layer.
  EXPECT_EQ(Error(", rope_scaling: {rope_type: dynamic, factor: 2, "
                  "original_max_position_embeddings: 8}",
                  /*features=*/4),
            "job.yaml:6:7: model.layers[0]: llama_block (layer 0): head_dim: "
            "must be more than 2 for rope_type dynamic; got 2");
}

}  // namespace
}  // namespace conveyor::engine
