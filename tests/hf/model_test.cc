// An HF config as a Conveyor model and back (hf/model.h) with what current
// checkpoints carry: llama3 RoPE scaling, a head_dim of its own, tied
// embeddings, the special token ids: the blocks take the config's values,
// and the model's HF config is the one it came from.
#include "hf/model.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model_spec.h"
#include "engine/rope.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::hf {
namespace {

using engine::RopeScaling;
using engine::RopeType;

// A tiny Llama 3.2: 2 blocks of 16 features, 4 heads of 6 (not 16 / 4),
// 2 key/value heads, llama3 scaling, tied, bos and a list of eos ids.
HfLlamaConfig Llama32() {
  HfLlamaConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.explicit_head_dim = 6;
  c.vocab_size = 40;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = {.type = RopeType::kLlama3,
                    .factor = 32.0,
                    .original_max_position_embeddings = 8,
                    .low_freq_factor = 1.0,
                    .high_freq_factor = 4.0};
  c.tie_word_embeddings = true;
  c.token_ids = {.bos = 1, .eos = {2, 3}, .eos_is_list = true};
  c.torch_dtype = "bfloat16";
  return c;
}

absl::StatusOr<engine::ModelSpec> Expand(const HfLlamaConfig& config,
                                         int64_t seq = 8) {
  engine::ModelSpec spec;
  spec.from_hf = "models/llama";
  spec.input_shape = {seq};
  spec.from_hf_where = {.file = "job.yaml", .line = 3, .column = 12};
  RETURN_IF_ERROR(ExpandHfModel(config, &spec));
  return spec;
}

TEST(HfModelTest, BlocksTakeTheHeadDimAndRopeScaling) {
  absl::StatusOr<engine::ModelSpec> spec = Expand(Llama32());
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->layers.size(), 5u);
  for (int i : {1, 2}) {
    const engine::LayerSpec& block = spec->layers[i];
    EXPECT_EQ(block.head_dim, 6);
    EXPECT_EQ(block.rope_theta, 500000.0);
    EXPECT_EQ(block.rope_scaling, Llama32().rope_scaling);
    // q [4 * 6, 16], k and v [2 * 6, 16], o [16, 4 * 6].
    EXPECT_EQ(block.params[1].shape, (std::vector<int64_t>{24, 16}));
    EXPECT_EQ(block.params[2].shape, (std::vector<int64_t>{12, 16}));
    EXPECT_EQ(block.params[4].shape, (std::vector<int64_t>{16, 24}));
  }
  EXPECT_TRUE(spec->layers.back().tied);
  EXPECT_EQ(spec->hf_keys,
            (engine::HfImportedKeys{.architecture = "LlamaForCausalLM",
                                    .max_position_embeddings = 64,
                                    .token_ids = Llama32().token_ids,
                                    .torch_dtype = "bfloat16"}));
}

TEST(HfModelTest, TheModelsConfigIsTheOneItCameFrom) {
  for (HfLlamaConfig config : {Llama32(), [] {
                                 HfLlamaConfig c = Llama32();
                                 c.explicit_head_dim = 0;  // 16 / 4
                                 c.token_ids = {.bos = 7, .eos = {8}, .pad = 0};
                                 c.architecture =
                                     std::string(kMistralArchitecture);
                                 c.model_type = "mistral";
                                 return c;
                               }()}) {
    SCOPED_TRACE(config.architecture);
    absl::StatusOr<engine::ModelSpec> spec = Expand(config);
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<HfLlamaConfig> back = HfConfigOfModel(*spec);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, config);
    EXPECT_EQ(back->torch_dtype, config.torch_dtype);
    // And its config.json parses back to it too.
    absl::StatusOr<HfLlamaConfig> parsed =
        ParseHfLlamaConfig(HfLlamaConfigJson(*back, HfDType::kBF16), "w");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, config);
  }
}

TEST(HfModelTest, AYamlModelsHeadDimAndScalingReachItsConfig) {
  absl::StatusOr<engine::ModelSpec> spec = engine::ParseModelSpecYaml(
      R"(model:
  input_shape: [16]
  init: {seed: 0}
  loss: cross_entropy
  layers:
    - embedding: {vocab_size: 40, features: 16}
    - llama_block:
        heads: 4
        kv_heads: 2
        head_dim: 6
        mlp_features: 24
        rope_scaling: {rope_type: dynamic, factor: 2,
                       original_max_position_embeddings: 12}
    - rmsnorm
    - lm_head: {vocab_size: 40}
)",
      "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<HfLlamaConfig> config = HfConfigOfModel(*spec);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->head_dim(), 6);
  EXPECT_EQ(config->explicit_head_dim, 6);
  EXPECT_EQ(config->rope_scaling.type, RopeType::kDynamic);
  // HF grows theta past max_position_embeddings: it is the model's original
  // length, not its sequence length.
  EXPECT_EQ(config->max_position_embeddings, 12);
  EXPECT_EQ(config->architecture, kLlamaArchitecture);
  EXPECT_EQ(config->token_ids, engine::SpecialTokenIds{});
}

TEST(HfModelTest, BlocksWithDifferentRopeHaveNoHfConfig) {
  absl::StatusOr<engine::ModelSpec> spec = engine::ParseModelSpecYaml(
      R"(model:
  input_shape: [8]
  init: {seed: 0}
  loss: cross_entropy
  layers:
    - embedding: {vocab_size: 40, features: 16}
    - llama_block: {heads: 4, mlp_features: 24}
    - llama_block: {heads: 4, mlp_features: 24,
                    rope_scaling: {rope_type: linear, factor: 2}}
    - rmsnorm
    - lm_head: {vocab_size: 40}
)",
      "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<HfLlamaConfig> config = HfConfigOfModel(*spec);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(),
              ::testing::HasSubstr("llama_block (layer 2): the model does not "
                                   "have the Llama layout"));
  EXPECT_THAT(config.status().message(),
              ::testing::HasSubstr("its options differ from the first "
                                   "llama_block's"));
}

TEST(HfModelTest, OnlyDynamicScalingRunsPastMaxPositions) {
  HfLlamaConfig config = Llama32();
  absl::StatusOr<engine::ModelSpec> spec = Expand(config, /*seq=*/65);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      spec.status().message(),
      ::testing::HasSubstr("input_shape has 65 tokens, more than the "
                           "checkpoint's max_position_embeddings (64)"));
  config.rope_scaling = {.type = RopeType::kDynamic,
                         .factor = 2.0,
                         .original_max_position_embeddings = 64};
  spec = Expand(config, /*seq=*/65);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->layers[1].rope_scaling.original_max_position_embeddings, 64);
}

}  // namespace
}  // namespace conveyor::hf
