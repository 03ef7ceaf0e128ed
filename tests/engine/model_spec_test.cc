#include "engine/model_spec.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A job whose layers start on line 6, so a layer written on line k of
// `layers` (1-based, indented by 4) is on line 5 + k of the file.
std::string Job(absl::string_view layers, absl::string_view input_shape = "[4]",
                absl::string_view loss = "mse") {
  return absl::StrCat("model:\n  input_shape: ", input_shape,
                      "\n  init: {seed: 0}\n  loss: ", loss, "\n  layers:\n",
                      layers);
}

ModelSpec ParseOk(const std::string& yaml) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(yaml, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status() << "\n" << yaml;
  return spec.ok() ? *std::move(spec) : ModelSpec{};
}

// The message of the InvalidArgument that parsing `yaml` must return.
std::string ParseError(const std::string& yaml) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(yaml, "job.yaml");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
      << spec.status() << "\n"
      << yaml;
  return std::string(spec.status().message());
}

std::vector<std::string> ParamNames(const ModelSpec& spec) {
  std::vector<std::string> names;
  for (const ParamSpec* p : spec.Params()) names.push_back(p->name);
  return names;
}

std::vector<LayerKind> Kinds(const ModelSpec& spec) {
  std::vector<LayerKind> kinds;
  for (const LayerSpec& layer : spec.layers) kinds.push_back(layer.kind);
  return kinds;
}

constexpr LayerKind kDense = LayerKind::kDense;
constexpr LayerKind kRelu = LayerKind::kRelu;

TEST(ModelSpecTest, IssueExampleInfersShapesStagesAndParams) {
  const ModelSpec spec = ParseOk(R"(
name: ignored-by-the-model-parser
model:
  input_shape: [512]          # per sample
  init: {seed: 0}
  remat: false
  layers:
    - dense: {features: 2048}
    - relu
    - boundary
    - dense: {features: 512}
    - repeat: 4
      boundary_every: 2
      layers:
        - dense: {features: 512}
        - relu
  loss: mse
)");
  EXPECT_EQ(spec.input_shape, (std::vector<int64_t>{512}));
  EXPECT_FALSE(spec.token_input);
  EXPECT_EQ(spec.seed, 0u);
  EXPECT_EQ(spec.init_from, "");
  EXPECT_FALSE(spec.remat);
  EXPECT_EQ(spec.loss, LossKind::kMse);
  ASSERT_EQ(spec.layers.size(), 11u);
  EXPECT_THAT(Kinds(spec),
              ElementsAre(kDense, kRelu, kDense, kDense, kRelu, kDense, kRelu,
                          kDense, kRelu, kDense, kRelu));
  for (int i = 0; i < 11; ++i) EXPECT_EQ(spec.layers[i].index, i);
  // Stages: [dense relu] | [dense, rep 1, rep 2] | [rep 3, rep 4].
  EXPECT_EQ(spec.num_stages, 3);
  EXPECT_THAT(spec.stage_begin, ElementsAre(0, 2, 7));
  EXPECT_EQ(spec.StageEnd(0), 2);
  EXPECT_EQ(spec.StageEnd(2), 11);
  EXPECT_EQ(spec.layers[6].stage, 1);
  EXPECT_EQ(spec.layers[7].stage, 2);

  EXPECT_EQ(spec.layers[0].input_shape, (std::vector<int64_t>{512}));
  EXPECT_EQ(spec.layers[0].output_shape, (std::vector<int64_t>{2048}));
  EXPECT_EQ(spec.layers[2].input_shape, (std::vector<int64_t>{2048}));
  EXPECT_EQ(spec.layers[2].output_shape, (std::vector<int64_t>{512}));
  EXPECT_EQ(spec.output_shape, (std::vector<int64_t>{512}));
  EXPECT_EQ(spec.target_shape, (std::vector<int64_t>{512}));
  EXPECT_FALSE(spec.integer_targets);

  const ParamSpec& w0 = spec.layers[0].params[0];
  EXPECT_EQ(w0.name, "layers.0.weight");
  EXPECT_EQ(w0.shape, (std::vector<int64_t>{2048, 512}));
  EXPECT_EQ(w0.init, ParamInit::kUniform);
  EXPECT_DOUBLE_EQ(w0.bound_or_std, 1.0 / std::sqrt(512.0));
  const ParamSpec& b2 = spec.layers[2].params[1];
  EXPECT_EQ(b2.name, "layers.2.bias");
  EXPECT_EQ(b2.shape, (std::vector<int64_t>{512}));
  EXPECT_DOUBLE_EQ(b2.bound_or_std, 1.0 / std::sqrt(2048.0));
  EXPECT_EQ(spec.layers[9].params[0].name, "layers.9.weight");
  EXPECT_EQ(spec.NumParams(),
            (512 * 2048 + 2048) + (2048 * 512 + 512) + 4 * (512 * 512 + 512));
  // Stage 2 holds the dense layers of repetitions 3 and 4.
  std::vector<std::string> stage2;
  for (const ParamSpec* p : spec.StageParams(2)) stage2.push_back(p->name);
  EXPECT_THAT(stage2, ElementsAre("layers.7.weight", "layers.7.bias",
                                  "layers.9.weight", "layers.9.bias"));
  // Layers inside a repeat share the YAML path and position.
  EXPECT_EQ(spec.layers[5].path, "model.layers[4].layers[0]");
  EXPECT_EQ(spec.layers[9].path, "model.layers[4].layers[0]");
  EXPECT_EQ(spec.layers[9].where.ToString(), "job.yaml:15:11");
}

TEST(ModelSpecTest, MlpParamNamesMatchNnSequential) {
  const ModelSpec spec = ParseOk(Job(R"(    - dense: {features: 8}
    - relu
    - dense: {features: 2, bias: false}
)"));
  EXPECT_THAT(ParamNames(spec), ElementsAre("layers.0.weight", "layers.0.bias",
                                            "layers.2.weight"));
  EXPECT_EQ(spec.layers[2].params[0].shape, (std::vector<int64_t>{2, 8}));
  EXPECT_FALSE(spec.layers[2].bias);
  EXPECT_EQ(spec.num_stages, 1);
  EXPECT_THAT(spec.stage_begin, ElementsAre(0));
  EXPECT_EQ(spec.StageParams(0).size(), 3u);
}

TEST(ModelSpecTest, DenseAppliesToTheLastDimension) {
  const ModelSpec spec = ParseOk(Job("    - dense: {features: 3}\n", "[5, 7]"));
  EXPECT_EQ(spec.output_shape, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(spec.layers[0].params[0].shape, (std::vector<int64_t>{3, 7}));
}

TEST(ModelSpecTest, RepeatWithBoundaryEveryAssignsStagesAndIndices) {
  const ModelSpec spec = ParseOk(Job(R"(    - dense: {features: 4}
    - repeat: 6
      boundary_every: 2
      layers: [relu, {dense: {features: 4}}]
)"));
  // 1 + 6 * 2 layers; boundaries after repetitions 2 and 4 (not after 6).
  ASSERT_EQ(spec.layers.size(), 13u);
  EXPECT_EQ(spec.num_stages, 3);
  EXPECT_THAT(spec.stage_begin, ElementsAre(0, 5, 9));
  std::vector<int> stages;
  for (const LayerSpec& layer : spec.layers) stages.push_back(layer.stage);
  EXPECT_THAT(stages, ElementsAre(0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2));
  EXPECT_EQ(spec.layers[12].params[0].name, "layers.12.weight");
  EXPECT_EQ(spec.StageEnd(1), 9);
}

TEST(ModelSpecTest, BoundaryEveryEqualToCountAddsNoBoundary) {
  const ModelSpec spec = ParseOk(Job(R"(    - repeat: 3
      boundary_every: 3
      layers: [relu]
)"));
  EXPECT_EQ(spec.layers.size(), 3u);
  EXPECT_EQ(spec.num_stages, 1);
}

TEST(ModelSpecTest, NestedRepeatExpandsInPlace) {
  const ModelSpec spec = ParseOk(Job(R"(    - repeat: 2
      layers:
        - dense: {features: 4}
        - repeat: 3
          layers: [relu]
        - boundary
    - dense: {features: 1}
)"));
  EXPECT_THAT(Kinds(spec), ElementsAre(kDense, kRelu, kRelu, kRelu, kDense,
                                       kRelu, kRelu, kRelu, kDense));
  EXPECT_THAT(spec.stage_begin, ElementsAre(0, 4, 8));
  EXPECT_THAT(ParamNames(spec),
              ElementsAre("layers.0.weight", "layers.0.bias", "layers.4.weight",
                          "layers.4.bias", "layers.8.weight", "layers.8.bias"));
  EXPECT_EQ(spec.layers[2].path, "model.layers[0].layers[1].layers[0]");
}

TEST(ModelSpecTest, TransformerBlockHasNestedTorchNames) {
  const ModelSpec spec = ParseOk(Job(R"(    - transformer_block:
        heads: 4
        mlp_features: 256
        norm: pre
        causal: true
        approximate: tanh
        eps: 1e-6
)",
                                     "[16, 64]"));
  ASSERT_EQ(spec.layers.size(), 1u);
  const LayerSpec& block = spec.layers[0];
  EXPECT_TRUE(block.pre_norm);
  EXPECT_TRUE(block.causal);
  EXPECT_TRUE(block.approximate_tanh);
  EXPECT_DOUBLE_EQ(block.eps, 1e-6);
  EXPECT_EQ(block.heads, 4);
  EXPECT_EQ(block.qkv_features, 64);
  EXPECT_EQ(block.output_shape, (std::vector<int64_t>{16, 64}));
  struct Expected {
    const char* name;
    std::vector<int64_t> shape;
    ParamInit init;
    double bound;
  };
  const std::vector<Expected> expected = {
      {"layers.0.attn.in_proj_weight",
       {192, 64},
       ParamInit::kXavierUniform,
       std::sqrt(6.0 / (64 + 192))},
      {"layers.0.attn.in_proj_bias", {192}, ParamInit::kZeros, 0},
      {"layers.0.attn.out_proj.weight", {64, 64}, ParamInit::kUniform, 1.0 / 8},
      {"layers.0.attn.out_proj.bias", {64}, ParamInit::kZeros, 0},
      {"layers.0.norm1.weight", {64}, ParamInit::kOnes, 0},
      {"layers.0.norm1.bias", {64}, ParamInit::kZeros, 0},
      {"layers.0.mlp.0.weight", {256, 64}, ParamInit::kUniform, 1.0 / 8},
      {"layers.0.mlp.0.bias", {256}, ParamInit::kUniform, 1.0 / 8},
      {"layers.0.mlp.2.weight", {64, 256}, ParamInit::kUniform, 1.0 / 16},
      {"layers.0.mlp.2.bias", {64}, ParamInit::kUniform, 1.0 / 16},
      {"layers.0.norm2.weight", {64}, ParamInit::kOnes, 0},
      {"layers.0.norm2.bias", {64}, ParamInit::kZeros, 0},
  };
  ASSERT_EQ(block.params.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(block.params[i].name, expected[i].name);
    EXPECT_EQ(block.params[i].shape, expected[i].shape);
    EXPECT_EQ(block.params[i].init, expected[i].init);
    EXPECT_DOUBLE_EQ(block.params[i].bound_or_std, expected[i].bound);
  }
}

TEST(ModelSpecTest, TransformerBlockDefaultsArePostNormExactGelu) {
  const ModelSpec spec = ParseOk(
      Job("    - transformer_block: {heads: 2, mlp_features: 8}\n", "[3, 4]"));
  EXPECT_FALSE(spec.layers[0].pre_norm);
  EXPECT_FALSE(spec.layers[0].causal);
  EXPECT_FALSE(spec.layers[0].approximate_tanh);
  EXPECT_DOUBLE_EQ(spec.layers[0].eps, 1e-5);
}

TEST(ModelSpecTest, LlamaBlockHasHfNamesAndInit) {
  const ModelSpec spec = ParseOk(Job(R"(    - llama_block:
        heads: 4
        kv_heads: 2
        mlp_features: 96
        rope_theta: 500000
        attention_bias: true
    - rmsnorm: {eps: 1e-5}
)",
                                     "[16, 32]"));
  ASSERT_EQ(spec.layers.size(), 2u);
  const LayerSpec& block = spec.layers[0];
  EXPECT_EQ(block.kind, LayerKind::kLlamaBlock);
  EXPECT_EQ(block.heads, 4);
  EXPECT_EQ(block.kv_heads, 2);
  EXPECT_DOUBLE_EQ(block.rope_theta, 500000);
  EXPECT_DOUBLE_EQ(block.eps, 1e-6);
  EXPECT_TRUE(block.causal);
  EXPECT_EQ(block.output_shape, (std::vector<int64_t>{16, 32}));
  struct Expected {
    const char* name;
    std::vector<int64_t> shape;
    ParamInit init;
    double std_dev;
  };
  // head_dim 8: k and v project to 2 heads of 8.
  const std::vector<Expected> expected = {
      {"layers.0.input_layernorm.weight", {32}, ParamInit::kOnes, 0},
      {"layers.0.self_attn.q_proj.weight", {32, 32}, ParamInit::kNormal, 0.02},
      {"layers.0.self_attn.q_proj.bias", {32}, ParamInit::kZeros, 0},
      {"layers.0.self_attn.k_proj.weight", {16, 32}, ParamInit::kNormal, 0.02},
      {"layers.0.self_attn.k_proj.bias", {16}, ParamInit::kZeros, 0},
      {"layers.0.self_attn.v_proj.weight", {16, 32}, ParamInit::kNormal, 0.02},
      {"layers.0.self_attn.v_proj.bias", {16}, ParamInit::kZeros, 0},
      {"layers.0.self_attn.o_proj.weight", {32, 32}, ParamInit::kNormal, 0.02},
      {"layers.0.post_attention_layernorm.weight", {32}, ParamInit::kOnes, 0},
      {"layers.0.mlp.gate_proj.weight", {96, 32}, ParamInit::kNormal, 0.02},
      {"layers.0.mlp.up_proj.weight", {96, 32}, ParamInit::kNormal, 0.02},
      {"layers.0.mlp.down_proj.weight", {32, 96}, ParamInit::kNormal, 0.02},
  };
  ASSERT_EQ(block.params.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(block.params[i].name, expected[i].name);
    EXPECT_EQ(block.params[i].shape, expected[i].shape);
    EXPECT_EQ(block.params[i].init, expected[i].init);
    EXPECT_DOUBLE_EQ(block.params[i].bound_or_std, expected[i].std_dev);
  }
  const LayerSpec& norm = spec.layers[1];
  EXPECT_DOUBLE_EQ(norm.eps, 1e-5);
  ASSERT_EQ(norm.params.size(), 1u);
  EXPECT_EQ(norm.params[0].name, "layers.1.weight");
}

TEST(ModelSpecTest, LlamaBlockDefaults) {
  const ModelSpec spec = ParseOk(
      Job("    - llama_block: {heads: 2, mlp_features: 8}\n    - rmsnorm\n",
          "[3, 4]"));
  const LayerSpec& block = spec.layers[0];
  EXPECT_EQ(block.kv_heads, 2);  // multi-head unless told otherwise
  EXPECT_DOUBLE_EQ(block.rope_theta, 10000);
  EXPECT_DOUBLE_EQ(block.eps, 1e-6);
  EXPECT_FALSE(block.bias);
  EXPECT_EQ(block.params.size(), 9u);  // no q/k/v biases
  EXPECT_DOUBLE_EQ(spec.layers[1].eps, 1e-6);
}

TEST(ModelSpecErrorTest, LlamaBlockShapesAndOptions) {
  EXPECT_EQ(ParseError(Job("    - llama_block: {heads: 4, kv_heads: 3, "
                           "mlp_features: 8}\n",
                           "[5, 24]")),
            "job.yaml:6:7: model.layers[0]: llama_block (layer 0): kv_heads = "
            "3 does not divide heads = 4 (each key/value head serves a whole "
            "group of query heads)");
  EXPECT_EQ(ParseError(Job("    - llama_block: {heads: 4, mlp_features: 8}\n",
                           "[5, 12]")),
            "job.yaml:6:7: model.layers[0]: llama_block (layer 0): the "
            "input's features (12) must split into heads = 4 of an even head "
            "size (rotary embedding turns pairs)");
  EXPECT_EQ(ParseError(Job("    - llama_block: {heads: 2, mlp_features: 8, "
                           "rope_theta: 1e40}\n",
                           "[5, 8]")),
            "job.yaml:6:60: model.layers[0].llama_block.rope_theta: must be at "
            "most 1e+30; got '1e40'");
  EXPECT_THAT(ParseError(Job("    - llama_block: {heads: 2, mlp_features: 8, "
                             "rope_theta: 0}\n",
                             "[5, 8]")),
              ::testing::HasSubstr("model.layers[0].llama_block.rope_theta: "));
  EXPECT_THAT(ParseError(Job("    - llama_block: {heads: 2, mlp_features: 8, "
                             "bias: true}\n",
                             "[5, 8]")),
              ::testing::HasSubstr("unknown key 'bias'"));
}

TEST(ModelSpecTest, AttentionWithQkvFeaturesAndNoBias) {
  const ModelSpec spec = ParseOk(Job(
      "    - attention: {heads: 2, qkv_features: 6, bias: false}\n", "[5, 4]"));
  const LayerSpec& attn = spec.layers[0];
  EXPECT_EQ(attn.qkv_features, 6);
  EXPECT_EQ(attn.output_shape, (std::vector<int64_t>{5, 4}));
  ASSERT_EQ(attn.params.size(), 2u);
  EXPECT_EQ(attn.params[0].name, "layers.0.in_proj_weight");
  EXPECT_EQ(attn.params[0].shape, (std::vector<int64_t>{18, 4}));
  EXPECT_DOUBLE_EQ(attn.params[0].bound_or_std, std::sqrt(6.0 / (4 + 18)));
  EXPECT_EQ(attn.params[1].name, "layers.0.out_proj.weight");
  EXPECT_EQ(attn.params[1].shape, (std::vector<int64_t>{4, 6}));
  EXPECT_DOUBLE_EQ(attn.params[1].bound_or_std, 1.0 / std::sqrt(6.0));
}

TEST(ModelSpecTest, AttentionDefaultsQkvToInputFeatures) {
  const ModelSpec spec =
      ParseOk(Job("    - attention: {heads: 2, causal: true}\n", "[5, 4]"));
  EXPECT_EQ(spec.layers[0].qkv_features, 4);
  EXPECT_TRUE(spec.layers[0].causal);
  EXPECT_THAT(
      ParamNames(spec),
      ElementsAre("layers.0.in_proj_weight", "layers.0.in_proj_bias",
                  "layers.0.out_proj.weight", "layers.0.out_proj.bias"));
}

TEST(ModelSpecTest, TokenModelWithEmbeddingLmHeadAndCrossEntropy) {
  const ModelSpec spec = ParseOk(Job(
      R"(    - embedding: {vocab_size: 1000, features: 64, max_positions: 128}
    - repeat: 2
      boundary_every: 1
      layers:
        - transformer_block: {heads: 4, mlp_features: 256, causal: true}
    - layernorm
    - lm_head: {vocab_size: 1000}
)",
      "[32]", "cross_entropy"));
  EXPECT_TRUE(spec.token_input);
  EXPECT_EQ(spec.loss, LossKind::kCrossEntropy);
  ASSERT_EQ(spec.layers.size(), 5u);
  EXPECT_EQ(spec.layers[0].output_shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(spec.output_shape, (std::vector<int64_t>{32, 1000}));
  EXPECT_EQ(spec.target_shape, (std::vector<int64_t>{32}));
  EXPECT_TRUE(spec.integer_targets);
  EXPECT_EQ(spec.num_stages, 2);
  EXPECT_THAT(spec.stage_begin, ElementsAre(0, 2));

  const std::vector<ParamSpec>& emb = spec.layers[0].params;
  ASSERT_EQ(emb.size(), 2u);
  EXPECT_EQ(emb[0].name, "layers.0.weight");
  EXPECT_EQ(emb[0].shape, (std::vector<int64_t>{1000, 64}));
  EXPECT_EQ(emb[0].init, ParamInit::kNormal);
  EXPECT_DOUBLE_EQ(emb[0].bound_or_std, 1.0);
  EXPECT_EQ(emb[1].name, "layers.0.position.weight");
  EXPECT_EQ(emb[1].shape, (std::vector<int64_t>{128, 64}));
  // lm_head has no bias by default.
  ASSERT_EQ(spec.layers[4].params.size(), 1u);
  EXPECT_EQ(spec.layers[4].params[0].name, "layers.4.weight");
  EXPECT_EQ(spec.layers[4].params[0].shape, (std::vector<int64_t>{1000, 64}));
  EXPECT_EQ(spec.layers[3].params[0].name, "layers.3.weight");
  EXPECT_EQ(spec.layers[3].params[0].init, ParamInit::kOnes);
  EXPECT_EQ(spec.layers[2].params[0].name, "layers.2.attn.in_proj_weight");
  const int64_t block = (3 * 64 * 64 + 3 * 64) + (64 * 64 + 64) + 2 * 64 +
                        (256 * 64 + 256) + (64 * 256 + 64) + 2 * 64;
  EXPECT_EQ(spec.NumParams(),
            1000 * 64 + 128 * 64 + 2 * block + 2 * 64 + 1000 * 64);
}

// The MFU numerator, by hand: 2 FLOPs per weight element per position,
// attention's 4 s^2 d, times 3 for the backward; lookups and norms free.
TEST(ModelSpecTest, TrainingFlopsPerSampleCountsMatricesAndAttention) {
  const ModelSpec spec = ParseOk(Job(
      R"(    - embedding: {vocab_size: 50, features: 8}
    - transformer_block: {heads: 2, mlp_features: 32, causal: true}
    - boundary
    - layernorm
    - lm_head: {vocab_size: 50, tied: true}
)",
      "[6]", "cross_entropy"));
  const double s = 6, d = 8;
  // in_proj (3d x d), out_proj (d x d), the MLP (32 x d, d x 32).
  const double block =
      2 * (3 * d * d + d * d + 32 * d + d * 32) * s + 4 * s * s * d;
  const double head = 2 * (50 * d) * s;  // The tied copy still multiplies.
  EXPECT_DOUBLE_EQ(spec.TrainingFlopsPerSample(), 3 * (block + head));

  const ModelSpec mlp =
      ParseOk(Job("    - dense: {features: 4}\n", "[3]", "mse"));
  EXPECT_DOUBLE_EQ(mlp.TrainingFlopsPerSample(), 3 * 2 * 3 * 4);
}

// lm_head: {tied: true}: the head's weight is the embedding's, held by the
// last stage as a tied copy. The model counts and lists it once.
TEST(ModelSpecTest, TiedLmHeadCopiesTheEmbeddingWeight) {
  const ModelSpec spec = ParseOk(Job(
      R"(    - embedding: {vocab_size: 50, features: 8}
    - dense: {features: 8}
    - boundary
    - rmsnorm
    - lm_head: {vocab_size: 50, tied: true}
)",
      "[6]", "cross_entropy"));
  ASSERT_EQ(spec.layers.size(), 4u);
  EXPECT_TRUE(spec.layers[3].tied);
  ASSERT_EQ(spec.layers[3].params.size(), 1u);
  const ParamSpec& copy = spec.layers[3].params[0];
  const ParamSpec& original = spec.layers[0].params[0];
  EXPECT_EQ(copy.name, "layers.0.weight");
  EXPECT_TRUE(copy.tied_copy);
  EXPECT_FALSE(original.tied_copy);
  EXPECT_EQ(copy.shape, original.shape);
  EXPECT_EQ(copy.init, original.init);
  EXPECT_EQ(copy.bound_or_std, original.bound_or_std);
  EXPECT_EQ(spec.output_shape, (std::vector<int64_t>{6, 50}));
  // Once in the model, and in both stages that hold it.
  EXPECT_THAT(ParamNames(spec),
              ElementsAre("layers.0.weight", "layers.1.weight", "layers.1.bias",
                          "layers.2.weight"));
  EXPECT_EQ(spec.NumParams(), 50 * 8 + 8 * 8 + 8 + 8);
  std::vector<std::string> last;
  for (const ParamSpec* p : spec.StageParams(1)) last.push_back(p->name);
  EXPECT_THAT(last, ElementsAre("layers.2.weight", "layers.0.weight"));
  EXPECT_EQ(
      spec.TiedParameters(),
      (std::vector<TiedParameter>{
          {.name = "layers.0.weight", .original_stage = 0, .copy_stage = 1}}));
  // Untied: nothing shared.
  EXPECT_TRUE(ParseOk(Job("    - embedding: {vocab_size: 50, features: 8}\n"
                          "    - lm_head: {vocab_size: 50}\n",
                          "[6]", "cross_entropy"))
                  .TiedParameters()
                  .empty());
}

TEST(ModelSpecErrorTest, TiedLmHeadNeedsAMatchingEmbedding) {
  EXPECT_EQ(ParseError(Job("    - embedding: {vocab_size: 50, features: 8}\n"
                           "    - lm_head: {vocab_size: 50, tied: true, bias: "
                           "true}\n",
                           "[6]", "cross_entropy")),
            "job.yaml:7:7: model.layers[1]: lm_head (layer 1): tied: true "
            "shares the embedding's weight, and an embedding has no bias to "
            "share: drop bias: true");
  EXPECT_EQ(ParseError(Job("    - embedding: {vocab_size: 50, features: 8}\n"
                           "    - lm_head: {vocab_size: 40, tied: true}\n",
                           "[6]", "cross_entropy")),
            "job.yaml:7:7: model.layers[1]: lm_head (layer 1): tied: true "
            "needs the embedding's vocabulary, but vocab_size is 40 here and "
            "50 there");
  EXPECT_EQ(ParseError(Job("    - embedding: {vocab_size: 50, features: 8}\n"
                           "    - dense: {features: 6}\n"
                           "    - lm_head: {vocab_size: 50, tied: true}\n",
                           "[6]", "cross_entropy")),
            "job.yaml:8:7: model.layers[2]: lm_head (layer 2): tied: true "
            "needs an input as wide as the embedding's output (8 features); "
            "this one has 6");
  EXPECT_EQ(ParseError(Job("    - dense: {features: 8}\n"
                           "    - lm_head: {vocab_size: 50, tied: true}\n",
                           "[6]", "cross_entropy")),
            "job.yaml:7:7: model.layers[1]: lm_head (layer 1): tied: true "
            "shares the weight of the embedding the model begins with, but "
            "its first layer is a dense");
  EXPECT_EQ(ParseError(Job("    - lm_head: {vocab_size: 50, tied: true}\n",
                           "[6]", "cross_entropy")),
            "job.yaml:6:7: model.layers[0]: lm_head (layer 0): tied: true "
            "shares the weight of an embedding, and the model must begin "
            "with one; it begins with this lm_head");
  EXPECT_THAT(ParseError(Job("    - embedding: {vocab_size: 50, features: 8}\n"
                             "    - lm_head: {vocab_size: 50, tied: yes}\n",
                             "[6]", "cross_entropy")),
              HasSubstr("tied"));
}

TEST(ModelSpecTest, OptionsAndInitFrom) {
  const ModelSpec spec = ParseOk(R"(model:
  input_shape: [2, 3]
  init: {from: "ckpt/params.safetensors"}
  remat: true
  loss: mse
  layers:
    - gelu: {approximate: tanh}
    - layernorm: {eps: 0.001}
    - gelu:
)");
  EXPECT_FALSE(spec.seed.has_value());
  EXPECT_EQ(spec.init_from, "ckpt/params.safetensors");
  EXPECT_TRUE(spec.remat);
  EXPECT_TRUE(spec.layers[0].approximate_tanh);
  EXPECT_FALSE(spec.layers[2].approximate_tanh);
  EXPECT_DOUBLE_EQ(spec.layers[1].eps, 0.001);
  EXPECT_EQ(spec.layers[1].params[0].name, "layers.1.weight");
  EXPECT_EQ(spec.layers[1].params[1].shape, (std::vector<int64_t>{3}));
}

TEST(ModelSpecTest, LargeSeedIsKeptExactly) {
  const ModelSpec spec = ParseOk(R"(model:
  input_shape: [2]
  init: {seed: 18446744073709551615}
  loss: mse
  layers: [relu]
)");
  EXPECT_EQ(spec.seed, 18446744073709551615u);
}

TEST(ModelSpecTest, DelayIsAnIdentityWithoutParameters) {
  const ModelSpec spec =
      ParseOk(Job(R"(    - delay: {forward_ms: 2.0, backward_ms: 4}
    - boundary
    - delay:
        forward_ms: 0.5
        backward_input_ms: 1.25
        backward_weight_ms: 0
    - dense: {features: 3}
)",
                  "[2, 4]"));
  ASSERT_EQ(spec.layers.size(), 3u);
  const LayerSpec& whole = spec.layers[0];
  EXPECT_EQ(whole.kind, LayerKind::kDelay);
  EXPECT_DOUBLE_EQ(whole.forward_ms, 2.0);
  // An unsplit backward is all BI; BW takes no time.
  EXPECT_DOUBLE_EQ(whole.backward_input_ms, 4.0);
  EXPECT_DOUBLE_EQ(whole.backward_weight_ms, 0.0);
  EXPECT_EQ(whole.input_shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(whole.output_shape, (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(whole.params.empty());
  const LayerSpec& split = spec.layers[1];
  EXPECT_EQ(split.stage, 1);
  EXPECT_DOUBLE_EQ(split.forward_ms, 0.5);
  EXPECT_DOUBLE_EQ(split.backward_input_ms, 1.25);
  EXPECT_DOUBLE_EQ(split.backward_weight_ms, 0.0);
  EXPECT_EQ(split.output_shape, (std::vector<int64_t>{2, 4}));
  // Parameter names keep counting the delay layers, as nn.Sequential would
  // count any parameter-free module.
  EXPECT_THAT(ParamNames(spec),
              ElementsAre("layers.2.weight", "layers.2.bias"));
  EXPECT_EQ(LayerKindName(LayerKind::kDelay), "delay");
}

TEST(ModelSpecTest, DelayAcceptsZeroAndTheLimit) {
  const ModelSpec spec =
      ParseOk(Job("    - delay: {forward_ms: 0, backward_ms: 60000}\n"));
  EXPECT_DOUBLE_EQ(spec.layers[0].forward_ms, 0.0);
  EXPECT_DOUBLE_EQ(spec.layers[0].backward_input_ms, kMaxDelayMs);
}

TEST(ModelSpecTest, ParseModelSpecTakesTheModelNode) {
  const YAML::Node doc = YAML::Load(Job("    - relu\n"));
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(doc["model"], "x.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->layers.size(), 1u);
  EXPECT_EQ(spec->layers[0].where.ToString(), "x.yaml:6:7");
}

TEST(ModelSpecTest, ParseModelSpecOnAMissingNodeIsAnErrorNotAThrow) {
  const YAML::Node doc = YAML::Load("other: 1\n");
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(doc["model"], "x.yaml");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "x.yaml: model: missing: the job has no 'model:' section");
}

TEST(ModelSpecTest, NamesFunctions) {
  EXPECT_EQ(LayerKindName(LayerKind::kTransformerBlock), "transformer_block");
  EXPECT_EQ(LayerKindName(LayerKind::kLmHead), "lm_head");
  EXPECT_EQ(ParamInitName(ParamInit::kXavierUniform), "xavier_uniform");
  EXPECT_EQ(LossKindName(LossKind::kCrossEntropy), "cross_entropy");
  EXPECT_EQ((SourceLocation{"f.yaml", 0, 0}).ToString(), "f.yaml");
  EXPECT_EQ((SourceLocation{"f.yaml", 3, 4}).ToString(), "f.yaml:3:4");
}

TEST(ModelSpecTest, DefaultModelSpecIsOneEmptyStage) {
  const ModelSpec spec;
  EXPECT_EQ(spec.num_stages, 1);
  EXPECT_THAT(spec.stage_begin, ElementsAre(0));
  EXPECT_EQ(spec.StageEnd(0), 0);
  EXPECT_TRUE(spec.StageParams(0).empty());
  EXPECT_EQ(spec.NumParams(), 0);
}

// ---- Errors: each names file:line:col and the YAML path. ----

TEST(ModelSpecErrorTest, UnknownOptionKey) {
  EXPECT_EQ(ParseError(Job("    - dense:\n        feature: 8\n")),
            "job.yaml:7:9: model.layers[0].dense: unknown key 'feature'; "
            "allowed: features, bias");
}

TEST(ModelSpecErrorTest, OptionOnAKindWithoutOptions) {
  EXPECT_EQ(ParseError(Job("    - relu: {inplace: true}\n")),
            "job.yaml:6:14: model.layers[0].relu: unknown key 'inplace'; this "
            "takes no options");
}

TEST(ModelSpecErrorTest, UnknownModelKey) {
  EXPECT_EQ(ParseError(Job("    - relu\n") + "  optimizer: adam\n"),
            "job.yaml:7:3: model: unknown key 'optimizer'; allowed: "
            "input_shape, init, remat, layers, loss, from_hf, boundaries");
}

TEST(ModelSpecErrorTest, DuplicateOptionKey) {
  EXPECT_EQ(ParseError(Job("    - dense:\n        features: 8\n"
                           "        features: 9\n")),
            "job.yaml:8:9: model.layers[0].dense: duplicate key 'features'");
}

TEST(ModelSpecErrorTest, DuplicateKeyInFlowMap) {
  EXPECT_EQ(ParseError(Job("    - dense: {features: 8, features: 9}\n")),
            "job.yaml:6:28: model.layers[0].dense: duplicate key 'features'");
}

TEST(ModelSpecErrorTest, DuplicateModelKeys) {
  EXPECT_EQ(ParseError(Job("    - relu\n") + "  loss: mse\n"),
            "job.yaml:7:3: model: duplicate key 'loss'");
  EXPECT_EQ(ParseError(Job("    - relu\n") + "model: {}\n"),
            "job.yaml:7:1: (top level): duplicate key 'model'");
}

TEST(ModelSpecErrorTest, WrongTypesForAPositiveInteger) {
  EXPECT_EQ(ParseError(Job("    - dense: {features: abc}\n")),
            "job.yaml:6:25: model.layers[0].dense.features: must be a positive "
            "integer; got 'abc'");
  EXPECT_EQ(ParseError(Job("    - dense: {features: 2.5}\n")),
            "job.yaml:6:25: model.layers[0].dense.features: must be a positive "
            "integer; got '2.5'");
  EXPECT_EQ(ParseError(Job("    - dense: {features: -3}\n")),
            "job.yaml:6:25: model.layers[0].dense.features: must be a positive "
            "integer; got '-3'");
  EXPECT_EQ(ParseError(Job("    - dense: {features: 0}\n")),
            "job.yaml:6:25: model.layers[0].dense.features: must be a positive "
            "integer; got '0'");
  EXPECT_EQ(ParseError(Job("    - dense: {features: \"8\"}\n")),
            "job.yaml:6:25: model.layers[0].dense.features: must be a positive "
            "integer; got the quoted string \"8\"");
  EXPECT_EQ(ParseError(Job("    - dense: {features: [8]}\n")),
            "job.yaml:6:25: model.layers[0].dense.features: must be a positive "
            "integer; got a list");
  // A missing value is reported at its key: yaml-cpp marks the next token.
  EXPECT_EQ(ParseError(Job("    - dense:\n        features:\n    - relu\n")),
            "job.yaml:7:9: model.layers[0].dense.features: must be a positive "
            "integer; got null");
}

TEST(ModelSpecErrorTest, WrongTypesForOtherOptions) {
  EXPECT_EQ(ParseError(Job("    - dense: {features: 8, bias: yes}\n")),
            "job.yaml:6:34: model.layers[0].dense.bias: must be true or false; "
            "got 'yes'");
  EXPECT_EQ(ParseError(Job("    - layernorm: {eps: -1}\n")),
            "job.yaml:6:24: model.layers[0].layernorm.eps: must be a positive "
            "number; got '-1'");
  EXPECT_EQ(ParseError(Job("    - layernorm: {eps: .nan}\n")),
            "job.yaml:6:24: model.layers[0].layernorm.eps: must be a positive "
            "number; got '.nan'");
  EXPECT_EQ(ParseError(Job("    - relu\n", "[4]", "l1")),
            "job.yaml:4:9: model.loss: must be one of: mse, cross_entropy; got "
            "'l1'");
  EXPECT_EQ(ParseError(Job("    - gelu: {approximate: fast}\n")),
            "job.yaml:6:27: model.layers[0].gelu.approximate: must be one of: "
            "none, tanh; got 'fast'");
  EXPECT_EQ(ParseError(Job("    - transformer_block: {heads: 1, "
                           "mlp_features: 4, norm: middle}\n",
                           "[2, 4]")),
            "job.yaml:6:60: model.layers[0].transformer_block.norm: must be "
            "one of: post, pre; got 'middle'");
  EXPECT_EQ(ParseError(Job("    - relu\n") + "  remat: 1\n"),
            "job.yaml:7:10: model.remat: must be true or false; got '1'");
}

TEST(ModelSpecErrorTest, MissingRequiredKeys) {
  EXPECT_EQ(ParseError(Job("    - dense: {}\n")),
            "job.yaml:6:14: model.layers[0].dense: missing required key "
            "'features'");
  EXPECT_EQ(ParseError(Job("    - relu\n    - dense\n")),
            "job.yaml:7:7: model.layers[1].dense: missing required key "
            "'features'");
  EXPECT_EQ(ParseError(Job("    - embedding: {features: 4}\n")),
            "job.yaml:6:18: model.layers[0].embedding: missing required key "
            "'vocab_size'");
  EXPECT_EQ(ParseError("model:\n  input_shape: [4]\n  layers: [relu]\n"
                       "  loss: mse\n"),
            "job.yaml:2:3: model: missing required key 'init'");
  EXPECT_EQ(ParseError("other: 1\n"),
            "job.yaml:1:1: (top level): missing required key 'model'");
}

TEST(ModelSpecErrorTest, InputShapeAndInit) {
  EXPECT_EQ(ParseError(Job("    - relu\n", "[]")),
            "job.yaml:2:16: model.input_shape: must be a non-empty list of "
            "positive integers (the shape of one sample); got a list");
  EXPECT_EQ(ParseError(Job("    - relu\n", "[4, 0]")),
            "job.yaml:2:20: model.input_shape[1]: must be a positive integer; "
            "got '0'");
  EXPECT_EQ(ParseError("model:\n  input_shape: [4]\n  init: {seed: 1, from: "
                       "a.safetensors}\n  loss: mse\n  layers: [relu]\n"),
            "job.yaml:3:9: model.init: give exactly one of 'seed' (an integer "
            ">= 0) or 'from' (a safetensors file)");
  EXPECT_EQ(ParseError("model:\n  input_shape: [4]\n  init: {seed: -1}\n"
                       "  loss: mse\n  layers: [relu]\n"),
            "job.yaml:3:16: model.init.seed: must be a non-negative integer; "
            "got '-1'");
  EXPECT_EQ(ParseError("model: [1, 2]\n"),
            "job.yaml:1:8: model: must be a map; got a list");
  EXPECT_EQ(ParseError("model:\n"),
            "job.yaml:1:1: model: must be a map; got null");
}

TEST(ModelSpecErrorTest, UnknownLayerKindListsTheAllowedOnes) {
  EXPECT_EQ(ParseError(Job("    - relu\n    - dens: {features: 8}\n")),
            "job.yaml:7:7: model.layers[1]: unknown layer kind 'dens'; "
            "allowed: dense, relu, gelu, layernorm, embedding, attention, "
            "transformer_block, lm_head, rmsnorm, llama_block, delay, "
            "boundary, repeat");
}

TEST(ModelSpecErrorTest, DelayOptions) {
  EXPECT_EQ(ParseError(Job("    - delay: {forward_ms: 1, backward_ms: 2, "
                           "backward: 3}\n")),
            "job.yaml:6:46: model.layers[0].delay: unknown key 'backward'; "
            "allowed: forward_ms, backward_ms, backward_input_ms, "
            "backward_weight_ms");
  EXPECT_EQ(ParseError(Job("    - delay: {forward_ms: -1, backward_ms: 2}\n")),
            "job.yaml:6:27: model.layers[0].delay.forward_ms: must be a "
            "non-negative number; got '-1'");
  EXPECT_EQ(ParseError(Job("    - delay: {forward_ms: 1, backward_ms: "
                           "60000.5}\n")),
            "job.yaml:6:43: model.layers[0].delay.backward_ms: must be at most "
            "60000 (one minute); got '60000.5'");
  EXPECT_EQ(ParseError(Job("    - delay: {forward_ms: 1e9, backward_ms: 1}\n")),
            "job.yaml:6:27: model.layers[0].delay.forward_ms: must be at most "
            "60000 (one minute); got '1e9'");
  EXPECT_EQ(
      ParseError(Job("    - delay: {forward_ms: .inf, backward_ms: 1}\n")),
      "job.yaml:6:27: model.layers[0].delay.forward_ms: must be a "
      "non-negative number; got '.inf'");
  EXPECT_EQ(
      ParseError(Job("    - delay: {forward_ms: \"2\", backward_ms: 1}\n")),
      "job.yaml:6:27: model.layers[0].delay.forward_ms: must be a "
      "non-negative number; got the quoted string \"2\"");
  EXPECT_EQ(ParseError(Job("    - delay: {forward_ms: 1, backward_input_ms: "
                           "1, backward_weight_ms: abc}\n")),
            "job.yaml:6:72: model.layers[0].delay.backward_weight_ms: must be "
            "a non-negative number; got 'abc'");
}

TEST(ModelSpecErrorTest, DelayNeedsForwardAndOneFormOfBackward) {
  EXPECT_EQ(ParseError(Job("    - delay\n")),
            "job.yaml:6:7: model.layers[0].delay: missing required key "
            "'forward_ms'");
  EXPECT_EQ(ParseError(Job("    - delay: {backward_ms: 1}\n")),
            "job.yaml:6:14: model.layers[0].delay: missing required key "
            "'forward_ms'");
  EXPECT_EQ(ParseError(Job("    - delay: {forward_ms: 1}\n")),
            "job.yaml:6:14: model.layers[0].delay: missing required key "
            "'backward_ms' (or backward_input_ms and backward_weight_ms for a "
            "split backward)");
  EXPECT_EQ(ParseError(Job("    - delay: {forward_ms: 1, "
                           "backward_input_ms: 1}\n")),
            "job.yaml:6:14: model.layers[0].delay: a split backward needs both "
            "backward_input_ms and backward_weight_ms; missing "
            "'backward_weight_ms'");
  EXPECT_EQ(ParseError(Job("    - delay:\n        forward_ms: 1\n"
                           "        backward_weight_ms: 1\n")),
            "job.yaml:7:9: model.layers[0].delay: a split backward needs both "
            "backward_input_ms and backward_weight_ms; missing "
            "'backward_input_ms'");
  EXPECT_EQ(ParseError(Job("    - delay:\n        forward_ms: 1\n"
                           "        backward_ms: 2\n"
                           "        backward_weight_ms: 1\n")),
            "job.yaml:9:9: model.layers[0].delay.backward_weight_ms: give "
            "either backward_ms or the split backward (backward_input_ms and "
            "backward_weight_ms), not both");
}

TEST(ModelSpecErrorTest, OptionsAtTheKindsIndentationAreCaught) {
  EXPECT_EQ(ParseError(Job("    - dense:\n      features: 8\n")),
            "job.yaml:6:7: model.layers[0]: a layer is a map with one key, its "
            "kind; found 2 keys (dense, features): are the options indented "
            "under the kind?");
}

TEST(ModelSpecErrorTest, LayersMustBeANonEmptyListOfEntries) {
  EXPECT_EQ(ParseError(Job("    - [relu]\n")),
            "job.yaml:6:7: model.layers[0]: a layer must be a kind (e.g. relu) "
            "or a map from a kind to its options (e.g. dense: {features: 8}); "
            "got a list");
  EXPECT_EQ(ParseError("model:\n  input_shape: [4]\n  init: {seed: 0}\n"
                       "  loss: mse\n  layers: []\n"),
            "job.yaml:5:11: model.layers: must be a non-empty list of layers; "
            "got a list");
}

TEST(ModelSpecErrorTest, MisplacedBoundaries) {
  EXPECT_EQ(ParseError(Job("    - boundary\n    - relu\n")),
            "job.yaml:6:7: model.layers[0]: a boundary cannot come first "
            "(before layer 0): the stage before it would have no layers");
  EXPECT_EQ(ParseError(Job("    - relu\n    - boundary\n")),
            "job.yaml:7:7: model.layers[1]: a boundary cannot come last (after "
            "layer 0): the stage after it would have no layers");
  EXPECT_EQ(ParseError(Job("    - relu\n    - relu\n    - boundary\n"
                           "    - boundary\n    - relu\n")),
            "job.yaml:9:7: model.layers[3]: two boundaries in a row (after "
            "layer 1): the stage between them would have no layers");
  // A body ending in a boundary plus boundary_every gives two in a row; the
  // error points at boundary_every.
  EXPECT_EQ(ParseError(Job(R"(    - repeat: 4
      boundary_every: 2
      layers: [relu, boundary]
    - relu
)")),
            "job.yaml:7:23: model.layers[0].boundary_every: two boundaries in "
            "a row (after layer 1): the stage between them would have no "
            "layers");
  EXPECT_EQ(ParseError(Job("    - relu\n    - boundary: {x: 1}\n    - relu\n")),
            "job.yaml:7:18: model.layers[1].boundary: unknown key 'x'; this "
            "takes no options");
}

TEST(ModelSpecErrorTest, RepeatOptions) {
  EXPECT_EQ(ParseError(Job("    - repeat: 0\n      layers: [relu]\n")),
            "job.yaml:6:15: model.layers[0].repeat: must be a positive "
            "integer; got '0'");
  EXPECT_EQ(ParseError(Job("    - repeat: 3\n      boundary_every: 4\n"
                           "      layers: [relu]\n")),
            "job.yaml:7:23: model.layers[0].boundary_every: must be at most 3; "
            "got 4");
  EXPECT_EQ(ParseError(Job("    - repeat: 3\n")),
            "job.yaml:6:7: model.layers[0]: missing required key 'layers'");
  EXPECT_EQ(ParseError(Job("    - repeat: 3\n      layer: [relu]\n")),
            "job.yaml:7:7: model.layers[0]: unknown key 'layer'; allowed: "
            "repeat, boundary_every, layers");
  EXPECT_EQ(ParseError(Job("    - repeat\n")),
            "job.yaml:6:7: model.layers[0]: repeat needs a count and a body: "
            "'- repeat: 4' with 'layers: [...]' at the same indentation as "
            "'repeat'");
  EXPECT_EQ(ParseError(Job("    - repeat: 2\n      layers:\n"
                           "        - relu\n        - dense: {}\n")),
            "job.yaml:9:18: model.layers[0].layers[1].dense: missing required "
            "key 'features'");
}

TEST(ModelSpecErrorTest, ShapeErrorsNameTheLayerAndShape) {
  EXPECT_EQ(ParseError(Job("    - relu\n    - attention: {heads: 2}\n", "[8]")),
            "job.yaml:7:7: model.layers[1]: attention (layer 1): needs a 2-D "
            "input [seq, features]; got [8] (start with an embedding, or give "
            "input_shape as [seq, features])");
  EXPECT_EQ(
      ParseError(Job("    - attention: {heads: 3}\n", "[5, 8]")),
      "job.yaml:6:7: model.layers[0]: attention (layer 0): qkv_features = "
      "8 is not divisible by heads = 3");
  EXPECT_EQ(ParseError(Job("    - transformer_block: {heads: 3, mlp_features: "
                           "4}\n",
                           "[5, 8]")),
            "job.yaml:6:7: model.layers[0]: transformer_block (layer 0): the "
            "input's features (8) are not divisible by heads = 3");
  EXPECT_EQ(ParseError(Job("    - transformer_block: {heads: 1, mlp_features: "
                           "4}\n",
                           "[2, 5, 8]")),
            "job.yaml:6:7: model.layers[0]: transformer_block (layer 0): needs "
            "a 2-D input [seq, features]; got [2, 5, 8]");
  EXPECT_EQ(ParseError(Job("    - relu\n    - embedding: {vocab_size: 10, "
                           "features: 4}\n")),
            "job.yaml:7:7: model.layers[1]: embedding (layer 1): must be the "
            "first layer: it takes integer token ids, and only the model's "
            "input is token ids");
  EXPECT_EQ(ParseError(Job("    - embedding: {vocab_size: 10, features: 4}\n",
                           "[3, 4]")),
            "job.yaml:6:7: model.layers[0]: embedding (layer 0): needs a 1-D "
            "input [seq] of token ids; got input_shape [3, 4]");
  EXPECT_EQ(ParseError(Job("    - embedding: {vocab_size: 10, features: 4, "
                           "max_positions: 16}\n",
                           "[32]")),
            "job.yaml:6:7: model.layers[0]: embedding (layer 0): the input has "
            "32 positions, more than max_positions = 16");
}

TEST(ModelSpecErrorTest, CrossEntropyNeedsClassLogits) {
  EXPECT_EQ(
      ParseError(Job("    - dense: {features: 1}\n", "[4]", "cross_entropy")),
      "job.yaml:4:9: model.loss: cross_entropy needs logits [..., "
      "classes] with at least 2 classes; the model's output is [1]");
  // A classifier's targets drop the class dimension.
  const ModelSpec spec =
      ParseOk(Job("    - dense: {features: 10}\n", "[4]", "cross_entropy"));
  EXPECT_TRUE(spec.target_shape.empty());
  EXPECT_TRUE(spec.integer_targets);
}

TEST(ModelSpecErrorTest, AbsurdSizesFailBeforeAllocation) {
  EXPECT_EQ(ParseError(Job("    - dense: {features: 16777217}\n")),
            "job.yaml:6:25: model.layers[0].dense.features: must be at most "
            "16777216; got 16777217");
  EXPECT_EQ(
      ParseError(Job("    - dense: {features: 99999999999999999999999}\n")),
      "job.yaml:6:25: model.layers[0].dense.features: must be at most "
      "16777216; got 99999999999999999999999");
  // 2^24 x 2^24 weights are 2^48 parameters.
  EXPECT_EQ(
      ParseError(Job("    - dense: {features: 16777216}\n", "[16777216]")),
      "job.yaml:6:7: model.layers[0]: dense (layer 0): the model reaches "
      "281474993487872 parameters here, above the limit of 17179869184");
  EXPECT_EQ(ParseError(Job("    - relu\n", "[16777216, 16777216]")),
            "job.yaml:2:16: model.input_shape: has more than 17179869184 "
            "elements per sample");
  EXPECT_EQ(ParseError(Job("    - relu\n", "[1, 1, 1, 1, 1, 1, 1, 1, 1]")),
            "job.yaml:2:16: model.input_shape: has 9 dimensions; at most 8 "
            "are supported");
}

TEST(ModelSpecErrorTest, ExpansionIsBounded) {
  EXPECT_EQ(
      ParseError(Job("    - repeat: 100000\n      layers: [relu, relu]\n")),
      "job.yaml:6:7: model.layers[0]: repeat expands the layer list "
      "past 100000 entries (layers and boundaries)");
  EXPECT_EQ(ParseError(Job("    - repeat: 100001\n      layers: [relu]\n")),
            "job.yaml:6:15: model.layers[0].repeat: must be at most 100000; "
            "got 100001");
  // Exactly at the limit is fine.
  const ModelSpec spec =
      ParseOk(Job("    - repeat: 50000\n      layers: [relu, relu]\n"));
  EXPECT_EQ(spec.layers.size(), 100000u);
}

TEST(ModelSpecErrorTest, AliasBombFailsFast) {
  // Each level refers to the previous one ten times: 10^9 layers if expanded.
  std::string yaml =
      "model:\n  input_shape: [4]\n  init: {seed: 0}\n  loss: mse\n"
      "  layers:\n"
      "    - &l0 {repeat: 1, layers: [relu, relu, relu, relu, relu, relu, "
      "relu, relu, relu, relu]}\n";
  for (int level = 1; level < 9; ++level) {
    const std::string prev = absl::StrCat("*l", level - 1);
    yaml += absl::StrCat("    - &l", level, " {repeat: 1, layers: [", prev);
    for (int i = 1; i < 10; ++i) yaml += absl::StrCat(", ", prev);
    yaml += "]}\n";
  }
  EXPECT_THAT(ParseError(yaml),
              HasSubstr("expands the layer list past 100000 entries"));
}

TEST(ModelSpecErrorTest, DeepRepeatNestingIsRejected) {
  std::string layers = "relu";
  for (int i = 0; i < 40; ++i) {
    layers = absl::StrCat("{repeat: 1, layers: [", layers, "]}");
  }
  EXPECT_THAT(ParseError(Job(absl::StrCat("    - ", layers, "\n"))),
              HasSubstr("repeats nest more than 32 levels deep"));
}

TEST(ModelSpecErrorTest, YamlSyntaxErrorHasAPosition) {
  EXPECT_EQ(ParseError("model:\n  layers: [relu, dense\n  loss: mse\n"),
            "job.yaml:3:7: YAML syntax error: end of sequence flow not found");
  EXPECT_THAT(ParseError("model:\n  a: 1\n b: 2\n"), StartsWith("job.yaml:3:"));
}

TEST(ModelSpecErrorTest, NonMapDocument) {
  EXPECT_EQ(ParseError("- model\n"),
            "job.yaml:1:1: (top level): must be a map with a 'model' key; got "
            "a list");
  EXPECT_EQ(ParseError(""),
            "job.yaml:1:1: (top level): must be a map with a 'model' key; got "
            "null");
}

// Six layers in two stages (a marker after the third), for re-cutting.
ModelSpec SixLayers() {
  return ParseOk(
      "model:\n  input_shape: [4]\n  init: {seed: 0}\n  layers:\n"
      "    - dense: {features: 8}\n"
      "    - relu\n"
      "    - dense: {features: 6}\n"
      "    - boundary\n"
      "    - gelu\n"
      "    - dense: {features: 5}\n"
      "    - relu\n"
      "  loss: mse\n");
}

std::vector<int> LayerStages(const ModelSpec& spec) {
  std::vector<int> stages;
  for (const LayerSpec& l : spec.layers) stages.push_back(l.stage);
  return stages;
}

TEST(SetStageBoundariesTest, RecutsStagesAndKeepsParameterNames) {
  ModelSpec spec = SixLayers();
  ASSERT_EQ(spec.layers.size(), 6u);
  ASSERT_EQ(spec.num_stages, 2);
  const std::vector<std::string> names = ParamNames(spec);

  ASSERT_TRUE(SetStageBoundaries(&spec, {0, 2, 5}).ok());
  EXPECT_EQ(spec.num_stages, 3);
  EXPECT_THAT(spec.stage_begin, ElementsAre(0, 2, 5));
  EXPECT_THAT(LayerStages(spec), ElementsAre(0, 0, 1, 1, 1, 2));
  EXPECT_EQ(spec.StageEnd(0), 2);
  EXPECT_EQ(spec.StageEnd(1), 5);
  EXPECT_EQ(spec.StageEnd(2), 6);
  EXPECT_EQ(ParamNames(spec), names);
  std::vector<std::string> middle;
  for (const ParamSpec* p : spec.StageParams(1)) middle.push_back(p->name);
  EXPECT_THAT(middle, ElementsAre("layers.2.weight", "layers.2.bias",
                                  "layers.4.weight", "layers.4.bias"));

  // One stage for everything, and one per layer.
  ASSERT_TRUE(SetStageBoundaries(&spec, {0}).ok());
  EXPECT_EQ(spec.num_stages, 1);
  EXPECT_EQ(spec.StageEnd(0), 6);
  EXPECT_THAT(LayerStages(spec), ElementsAre(0, 0, 0, 0, 0, 0));
  ASSERT_TRUE(SetStageBoundaries(&spec, {0, 1, 2, 3, 4, 5}).ok());
  EXPECT_EQ(spec.num_stages, 6);
  EXPECT_THAT(LayerStages(spec), ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(SetStageBoundariesTest, MalformedSplitIsInvalidAndChangesNothing) {
  const std::vector<std::vector<int>> bad = {
      {},                     // No stages.
      {1, 3},                 // Does not start at 0.
      {0, 3, 3},              // Not strictly increasing.
      {0, 4, 2},              // Out of order.
      {0, 6},                 // Past the last layer.
      {0, -1},                // Negative.
      {0, 1, 2, 3, 4, 5, 6},  // More stages than layers.
  };
  for (const std::vector<int>& split : bad) {
    SCOPED_TRACE(::testing::PrintToString(split));
    ModelSpec spec = SixLayers();
    const absl::Status status = SetStageBoundaries(&spec, split);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(spec.num_stages, 2);
    EXPECT_THAT(spec.stage_begin, ElementsAre(0, 3));
    EXPECT_THAT(LayerStages(spec), ElementsAre(0, 0, 0, 1, 1, 1));
  }
}

}  // namespace
}  // namespace conveyor::engine
