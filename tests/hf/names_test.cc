#include "hf/names.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::hf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

std::string Msg(const absl::Status& status) {
  return std::string(status.message());
}

HfLlamaConfig SmallConfig() {
  HfLlamaConfig c;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 10;
  c.max_position_embeddings = 16;
  return c;
}

TEST(HfNamesTest, MapsHfNamesToConveyor) {
  const std::pair<const char*, const char*> cases[] = {
      {"model.embed_tokens.weight", "layers.0.weight"},
      {"model.layers.0.input_layernorm.weight",
       "layers.1.input_layernorm.weight"},
      {"model.layers.0.self_attn.q_proj.bias",
       "layers.1.self_attn.q_proj.bias"},
      {"model.layers.21.mlp.down_proj.weight",
       "layers.22.mlp.down_proj.weight"},
      {"model.layers.10.post_attention_layernorm.weight",
       "layers.11.post_attention_layernorm.weight"},
      {"model.norm.weight", "layers.23.weight"},
      {"lm_head.weight", "layers.24.weight"},
  };
  for (const auto& [hf, conveyor] : cases) {
    absl::StatusOr<std::string> to_conveyor = HfNameToConveyor(hf, 22);
    ASSERT_TRUE(to_conveyor.ok()) << to_conveyor.status();
    EXPECT_EQ(*to_conveyor, conveyor);
    absl::StatusOr<std::string> to_hf = ConveyorNameToHf(conveyor, 22);
    ASSERT_TRUE(to_hf.ok()) << to_hf.status();
    EXPECT_EQ(*to_hf, hf);
  }
}

TEST(HfNamesTest, EveryExpectedTensorMapsBothWays) {
  HfLlamaConfig c = SmallConfig();
  c.attention_bias = true;
  c.architecture = std::string(kQwen2Architecture);
  c.model_type = "qwen2";
  std::set<std::string> hf_names;
  for (const auto& [name, shape] : ExpectedLlamaTensors(c)) {
    absl::StatusOr<std::string> hf = ConveyorNameToHf(name, 2);
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_TRUE(hf_names.insert(*hf).second) << *hf;
    absl::StatusOr<std::string> back = HfNameToConveyor(*hf, 2);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, name);
  }
  EXPECT_EQ(hf_names.size(), 1 + 2 * 12 + 2u);
}

TEST(HfNamesTest, RefusesHfNamesOutsideTheLayout) {
  const char* const bad[] = {
      "model.layers.0.self_attn.o_proj.bias",  // Llama's attention_bias
      "model.layers.0.mlp.gate_proj.bias",
      "model.layers.00.mlp.up_proj.weight",
      "model.layers.+1.mlp.up_proj.weight",
      "model.layers.-1.mlp.up_proj.weight",
      "model.layers.1",
      "model.layers..mlp.up_proj.weight",
      "model.layers.99999999999999999999.mlp.up_proj.weight",
      "model.embed_tokens.weight.extra",
      "transformer.wte.weight",
      "",
      "model.layers.0.self_attn.rotary_emb.inv_freq",
  };
  for (const char* name : bad) {
    absl::StatusOr<std::string> mapped = HfNameToConveyor(name, 4);
    EXPECT_FALSE(mapped.ok()) << name << " -> " << *mapped;
    EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Msg(HfNameToConveyor("transformer.wte.weight", 4).status()),
            "HF tensor \"transformer.wte.weight\" is not part of the Llama "
            "layout (model.embed_tokens, model.layers.<i>.*, model.norm, "
            "lm_head)");
}

TEST(HfNamesTest, RefusesBlockIndexPastTheModel) {
  absl::StatusOr<std::string> mapped =
      HfNameToConveyor("model.layers.4.mlp.up_proj.weight", 4);
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(Msg(mapped.status()),
            "HF tensor \"model.layers.4.mlp.up_proj.weight\" names block 4, "
            "but the model has 4 (num_hidden_layers)");
  EXPECT_TRUE(HfNameToConveyor("model.layers.3.mlp.up_proj.weight", 4).ok());
}

TEST(HfNamesTest, RefusesConveyorNamesOutsideTheLayout) {
  const char* const bad[] = {
      "layers.0.bias",
      "layers.0.input_layernorm.weight",
      "layers.3.weight",
      "layers.5.mlp.up_proj.weight",
      "layers.6.weight",
      "layers.05.weight",
      "layers.1.attn.in_proj_weight",
      "model.norm.weight",
  };
  for (const char* name : bad) {
    absl::StatusOr<std::string> mapped = ConveyorNameToHf(name, 3);
    EXPECT_FALSE(mapped.ok()) << name << " -> " << *mapped;
    EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(Msg(ConveyorNameToHf("layers.6.weight", 3).status()),
              HasSubstr("Conveyor tensor \"layers.6.weight\" is not part of "
                        "the Llama layout with 3 blocks"));
  EXPECT_EQ(*ConveyorNameToHf("layers.4.weight", 3), "model.norm.weight");
  EXPECT_EQ(*ConveyorNameToHf("layers.5.weight", 3), "lm_head.weight");
}

TEST(HfNamesTest, ErrorsEscapeHostileNames) {
  absl::StatusOr<std::string> mapped =
      HfNameToConveyor(std::string("bad\n\x01name", 9), 2);
  ASSERT_FALSE(mapped.ok());
  EXPECT_THAT(Msg(mapped.status()), HasSubstr("\"bad\\n\\x01name\""));
}

TEST(HfNamesTest, RotaryFrequenciesAreIgnorable) {
  EXPECT_TRUE(
      IsIgnorableHfTensor("model.layers.3.self_attn.rotary_emb.inv_freq"));
  EXPECT_TRUE(IsIgnorableHfTensor("model.rotary_emb.inv_freq"));
  EXPECT_FALSE(IsIgnorableHfTensor("model.layers.3.self_attn.q_proj.weight"));
  EXPECT_FALSE(IsIgnorableHfTensor("rotary_emb.inv_freq.weight"));
}

TEST(HfNamesTest, ExpectedTensorsInLayerOrderWithShapes) {
  const TensorShapes tensors = ExpectedLlamaTensors(SmallConfig());
  // head_dim 2, 2 kv heads: k and v project to 4 features.
  ASSERT_EQ(tensors.size(), 1 + 2 * 9 + 2u);
  using Shape = std::vector<int64_t>;
  EXPECT_THAT(
      std::vector(tensors.begin(), tensors.begin() + 10),
      ElementsAre(Pair("layers.0.weight", Shape{10, 8}),
                  Pair("layers.1.input_layernorm.weight", Shape{8}),
                  Pair("layers.1.self_attn.q_proj.weight", Shape{8, 8}),
                  Pair("layers.1.self_attn.k_proj.weight", Shape{4, 8}),
                  Pair("layers.1.self_attn.v_proj.weight", Shape{4, 8}),
                  Pair("layers.1.self_attn.o_proj.weight", Shape{8, 8}),
                  Pair("layers.1.post_attention_layernorm.weight", Shape{8}),
                  Pair("layers.1.mlp.gate_proj.weight", Shape{12, 8}),
                  Pair("layers.1.mlp.up_proj.weight", Shape{12, 8}),
                  Pair("layers.1.mlp.down_proj.weight", Shape{8, 12})));
  EXPECT_THAT(tensors[tensors.size() - 2], Pair("layers.3.weight", Shape{8}));
  EXPECT_THAT(tensors.back(), Pair("layers.4.weight", Shape{10, 8}));
}

TEST(HfNamesTest, ExpectedTensorsWithBiasesAndTiedHead) {
  HfLlamaConfig c = SmallConfig();
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  const TensorShapes tensors = ExpectedLlamaTensors(c);
  ASSERT_EQ(tensors.size(), 1 + 2 * 12 + 1u);
  using Shape = std::vector<int64_t>;
  EXPECT_THAT(tensors[3], Pair("layers.1.self_attn.q_proj.bias", Shape{8}));
  EXPECT_THAT(tensors[5], Pair("layers.1.self_attn.k_proj.bias", Shape{4}));
  EXPECT_THAT(tensors[7], Pair("layers.1.self_attn.v_proj.bias", Shape{4}));
  // The final norm is last: no lm_head.
  EXPECT_THAT(tensors.back(), Pair("layers.3.weight", Shape{8}));
}

}  // namespace
}  // namespace conveyor::hf
