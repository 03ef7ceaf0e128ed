#include "hf/config.h"

#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor::hf {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Modeled on TinyLlama/TinyLlama-1.1B-Chat-v1.0's config.json.
constexpr char kTinyLlama[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Modeled on mistralai/Mistral-7B-Instruct-v0.2's config.json.
constexpr char kMistral[] = R"({
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Modeled on Qwen/Qwen2-0.5B's config.json: tied embeddings, and a
// sliding_window that does nothing while use_sliding_window is false.
constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 131072,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Modeled on meta-llama/Llama-3.2-1B-Instruct's config.json: llama3 RoPE
// scaling, tied embeddings, grouped-query attention, a stated head_dim and
// a list of end-of-turn ids.
constexpr char kLlama32[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

std::string Msg(const absl::Status& status) {
  return std::string(status.message());
}

// `base` with `edit` applied, as text.
std::string Edited(const char* base, const std::function<void(Json&)>& edit) {
  Json json = Json::parse(base);
  edit(json);
  return json.dump(2);
}

TEST(HfConfigTest, ParsesTinyLlama) {
  absl::StatusOr<HfLlamaConfig> c = ParseHfLlamaConfig(kTinyLlama, "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->intermediate_size, 5632);
  EXPECT_EQ(c->num_hidden_layers, 22);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->hidden_act, "silu");
}

TEST(HfConfigTest, ParsesMistralWithoutSlidingWindow) {
  absl::StatusOr<HfLlamaConfig> c = ParseHfLlamaConfig(kMistral, "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_FALSE(c->attention_bias);
}

TEST(HfConfigTest, ParsesQwen2WithTiedEmbeddingsAndBiases) {
  absl::StatusOr<HfLlamaConfig> c = ParseHfLlamaConfig(kQwen2, "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_EQ(c->hidden_size, 896);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_TRUE(c->tie_word_embeddings);
  // Qwen2's q/k/v always carry biases; its config has no key for them.
  EXPECT_TRUE(c->attention_bias);
}

TEST(HfConfigTest, AbsentKeysTakeTransformersDefaults) {
  const std::string text = Edited(kTinyLlama, [](Json& j) {
    for (const char* key :
         {"num_key_value_heads", "rms_norm_eps", "rope_theta", "model_type",
          "tie_word_embeddings", "hidden_act", "attention_bias"}) {
      j.erase(key);
    }
  });
  absl::StatusOr<HfLlamaConfig> c = ParseHfLlamaConfig(text, "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 32);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->hidden_act, "silu");
  EXPECT_FALSE(c->attention_bias);
}

TEST(HfConfigTest, ParsesLlama32WithRopeScalingAndTokenIds) {
  absl::StatusOr<HfLlamaConfig> c = ParseHfLlamaConfig(kLlama32, "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling,
            (engine::RopeScaling{.type = engine::RopeType::kLlama3,
                                 .factor = 32,
                                 .original_max_position_embeddings = 8192,
                                 .low_freq_factor = 1,
                                 .high_freq_factor = 4}));
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_EQ(c->explicit_head_dim, 0);  // 64 is hidden_size / heads
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->token_ids.bos, 128000);
  EXPECT_EQ(c->token_ids.eos, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_TRUE(c->token_ids.eos_is_list);
  EXPECT_EQ(c->token_ids.pad, std::nullopt);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  // TinyLlama states one eos id.
  c = ParseHfLlamaConfig(kTinyLlama, "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->token_ids.eos, (std::vector<int64_t>{2}));
  EXPECT_FALSE(c->token_ids.eos_is_list);
}

TEST(HfConfigTest, HeadDimOtherThanHiddenOverHeads) {
  // Mistral-Nemo: 32 heads of 128 on 5120 features; and heads that do not
  // divide hidden_size at all, which a stated head_dim makes fine.
  absl::StatusOr<HfLlamaConfig> c =
      ParseHfLlamaConfig(Edited(kMistral,
                                [](Json& j) {
                                  j["hidden_size"] = 5120;
                                  j["head_dim"] = 128;
                                }),
                         "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim(), 128);
  EXPECT_EQ(c->explicit_head_dim, 128);
  c = ParseHfLlamaConfig(Edited(kTinyLlama,
                                [](Json& j) {
                                  j["num_attention_heads"] = 30;
                                  j["num_key_value_heads"] = 5;
                                  j["head_dim"] = 64;
                                }),
                         "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim(), 64);
}

TEST(HfConfigTest, ParsesEveryRopeTypeWithHfDefaults) {
  auto parse = [](const Json& rope) {
    absl::StatusOr<HfLlamaConfig> c = ParseHfLlamaConfig(
        Edited(kTinyLlama, [&](Json& j) { j["rope_scaling"] = rope; }), "x");
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->rope_scaling : engine::RopeScaling{};
  };
  using engine::RopeScaling;
  using engine::RopeType;
  // "type" is the older name of rope_type.
  EXPECT_EQ(parse({{"type", "linear"}, {"factor", 2.0}}),
            (RopeScaling{.type = RopeType::kLinear, .factor = 2}));
  // Dynamic grows theta past max_position_embeddings (2048), whatever the
  // object says.
  EXPECT_EQ(parse({{"rope_type", "dynamic"},
                   {"factor", 4},
                   {"original_max_position_embeddings", 1024}}),
            (RopeScaling{.type = RopeType::kDynamic,
                         .factor = 4,
                         .original_max_position_embeddings = 2048}));
  // yarn: the original length defaults to max_position_embeddings, a beta
  // of 0 or null to HF's 32 and 1.
  EXPECT_EQ(parse({{"rope_type", "yarn"},
                   {"factor", 4.0},
                   {"beta_fast", 0},
                   {"beta_slow", nullptr}}),
            (RopeScaling{.type = RopeType::kYarn,
                         .factor = 4,
                         .original_max_position_embeddings = 2048}));
  EXPECT_EQ(parse({{"rope_type", "yarn"},
                   {"factor", 40},
                   {"original_max_position_embeddings", 512},
                   {"mscale", 1.0},
                   {"mscale_all_dim", 0.5},
                   {"truncate", false}}),
            (RopeScaling{.type = RopeType::kYarn,
                         .factor = 40,
                         .original_max_position_embeddings = 512,
                         .mscale = 1.0,
                         .mscale_all_dim = 0.5,
                         .truncate = false}));
  EXPECT_EQ(parse({{"rope_type", "default"}}), RopeScaling{});
  EXPECT_EQ(parse(nullptr), RopeScaling{});
}

TEST(HfConfigTest, ReadsTransformers5RopeParameters) {
  absl::StatusOr<HfLlamaConfig> c =
      ParseHfLlamaConfig(Edited(kLlama32,
                                [](Json& j) {
                                  j["rope_parameters"] = j["rope_scaling"];
                                  j["rope_parameters"]["rope_theta"] = 250000.0;
                                  j.erase("rope_scaling");
                                  j.erase("rope_theta");
                                }),
                         "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 250000.0);
  EXPECT_EQ(c->rope_scaling.type, engine::RopeType::kLlama3);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
}

TEST(HfConfigTest, NullKvHeadsAndMatchingHeadDimAreAccepted) {
  const std::string text = Edited(kTinyLlama, [](Json& j) {
    j["num_key_value_heads"] = nullptr;
    j["head_dim"] = 64;
    j["unknown_future_key"] = {{"nested", {1, 2, 3}}};
  });
  absl::StatusOr<HfLlamaConfig> c = ParseHfLlamaConfig(text, "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 32);
}

struct Refusal {
  const char* base;
  std::function<void(Json&)> edit;
  std::string message;
};

TEST(HfConfigTest, RefusesWhatConveyorCannotRepresentWithExactMessages) {
  const std::string kSupported =
      "supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";
  const std::string kRange = "must be an integer in [1, 16777216]; got ";
  const std::vector<Refusal> refusals = {
      {kTinyLlama, [](Json& j) { j["architectures"] = {"GPT2LMHeadModel"}; },
       "config.json: architectures: unsupported \"GPT2LMHeadModel\"; " +
           kSupported},
      {kTinyLlama, [](Json& j) { j["architectures"] = "LlamaForCausalLM"; },
       "config.json: architectures: must be a list of one architecture "
       "name; got \"LlamaForCausalLM\""},
      {kTinyLlama,
       [](Json& j) {
         j["architectures"] = {"LlamaForCausalLM", "MistralForCausalLM"};
       },
       "config.json: architectures: must be a list of one architecture "
       "name; got [\"LlamaForCausalLM\",\"MistralForCausalLM\"]"},
      {kTinyLlama, [](Json& j) { j.erase("architectures"); },
       "config.json: architectures: missing; " + kSupported},
      {kTinyLlama,
       [](Json& j) {
         j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
       },
       "config.json: rope_scaling.rope_type: must be one of default, linear, "
       "dynamic, yarn, llama3 (the types Conveyor computes); got "
       "\"longrope\""},
      {kTinyLlama,
       [](Json& j) {
         j["rope_scaling"] = {{"type", "su"}, {"factor", 2.0}};
       },
       "config.json: rope_scaling.type: must be one of default, linear, "
       "dynamic, yarn, llama3 (the types Conveyor computes); got \"su\""},
      {kTinyLlama, [](Json& j) { j["rope_scaling"] = "linear"; },
       "config.json: rope_scaling: must be an object or null; got "
       "\"linear\""},
      {kTinyLlama,
       [](Json& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}};
       },
       "config.json: rope_scaling.factor: missing"},
      {kLlama32, [](Json& j) { j["rope_scaling"].erase("low_freq_factor"); },
       "config.json: rope_scaling.low_freq_factor: missing"},
      {kLlama32,
       [](Json& j) {
         j["rope_scaling"]["original_max_position_embeddings"] = 0;
       },
       "config.json: rope_scaling.original_max_position_embeddings: must be "
       "an integer in [1, 16777216]; got 0"},
      {kLlama32, [](Json& j) { j["rope_scaling"]["factor"] = 0.5; },
       "config.json: rope_scaling.factor: must be a finite number >= 1 for "
       "rope_type llama3; got 0.5"},
      {kLlama32, [](Json& j) { j["rope_scaling"]["high_freq_factor"] = 1.0; },
       "config.json: rope_scaling.high_freq_factor: must be finite and more "
       "than low_freq_factor (1); got 1"},
      {kLlama32, [](Json& j) { j["rope_scaling"]["factor"] = "32"; },
       "config.json: rope_scaling.factor: must be a number; got \"32\""},
      {kTinyLlama,
       [](Json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
         j["rope_theta"] = 1.0;
       },
       "config.json: rope_theta: must be more than 1 for rope_type yarn; got "
       "1"},
      {kTinyLlama, [](Json& j) { j["partial_rotary_factor"] = 0.5; },
       "config.json: partial_rotary_factor: must be 1 (every feature of a "
       "head turns); got 0.5"},
      {kTinyLlama, [](Json& j) { j["head_dim"] = 63; },
       "config.json: head_dim: must be even, positive, and at most 16777216 "
       "times num_attention_heads; got 63"},
      {kTinyLlama, [](Json& j) { j["head_dim"] = 0; },
       "config.json: head_dim: must be an integer in [1, 16777216]; got 0"},
      {kTinyLlama, [](Json& j) { j["eos_token_id"] = "2"; },
       "config.json: eos_token_id: must be an integer in [-2147483648, "
       "2147483647] or a list of at most 1024 of them; got \"2\""},
      {kTinyLlama,
       [](Json& j) {
         j["eos_token_id"] = {2, 2.5};
       },
       "config.json: eos_token_id: must be an integer in [-2147483648, "
       "2147483647] or a list of at most 1024 of them; got [2,2.5]"},
      {kTinyLlama, [](Json& j) { j["bos_token_id"] = 4294967296; },
       "config.json: bos_token_id: must be an integer in [-2147483648, "
       "2147483647]; got 4294967296"},
      {kTinyLlama, [](Json& j) { j["hidden_act"] = "gelu"; },
       "config.json: hidden_act: must be \"silu\"; got \"gelu\""},
      {kTinyLlama, [](Json& j) { j["mlp_bias"] = true; },
       "config.json: mlp_bias: must be false (MLP biases are not "
       "supported); got true"},
      {kTinyLlama, [](Json& j) { j["num_attention_heads"] = 30; },
       "config.json: num_attention_heads: must divide hidden_size = 2048 "
       "(or head_dim must be given); got 30"},
      {kTinyLlama, [](Json& j) { j["num_attention_heads"] = 2048; },
       "config.json: num_attention_heads: gives an odd head size 1 "
       "(hidden_size 2048 / 2048 heads); rotary embedding needs an even "
       "one"},
      {kTinyLlama, [](Json& j) { j["num_key_value_heads"] = 5; },
       "config.json: num_key_value_heads: must divide num_attention_heads "
       "= 32; got 5"},
      {kTinyLlama, [](Json& j) { j["hidden_size"] = -1; },
       "config.json: hidden_size: " + kRange + "-1"},
      {kTinyLlama, [](Json& j) { j["num_hidden_layers"] = 0; },
       "config.json: num_hidden_layers: " + kRange + "0"},
      {kTinyLlama, [](Json& j) { j["vocab_size"] = 16777217; },
       "config.json: vocab_size: " + kRange + "16777217"},
      {kTinyLlama,
       [](Json& j) { j["max_position_embeddings"] = 18446744073709551615u; },
       "config.json: max_position_embeddings: " + kRange +
           "18446744073709551615"},
      {kTinyLlama, [](Json& j) { j["hidden_size"] = "2048"; },
       "config.json: hidden_size: " + kRange + "\"2048\""},
      {kTinyLlama, [](Json& j) { j["intermediate_size"] = 5632.0; },
       "config.json: intermediate_size: " + kRange + "5632.0"},
      {kTinyLlama, [](Json& j) { j["hidden_size"] = nullptr; },
       "config.json: hidden_size: " + kRange + "null"},
      {kTinyLlama, [](Json& j) { j.erase("intermediate_size"); },
       "config.json: intermediate_size: missing"},
      {kTinyLlama, [](Json& j) { j["tie_word_embeddings"] = "false"; },
       "config.json: tie_word_embeddings: must be true or false; got "
       "\"false\""},
      {kTinyLlama, [](Json& j) { j["rms_norm_eps"] = "1e-5"; },
       "config.json: rms_norm_eps: must be a number; got \"1e-5\""},
      {kTinyLlama, [](Json& j) { j["rms_norm_eps"] = 0; },
       "config.json: rms_norm_eps: must be in (0, 1); got 0"},
      {kTinyLlama, [](Json& j) { j["rope_theta"] = -1; },
       "config.json: rope_theta: must be positive and finite; got -1"},
      {kTinyLlama, [](Json& j) { j["model_type"] = "mistral"; },
       "config.json: model_type: must be \"llama\" for LlamaForCausalLM; "
       "got \"mistral\""},
      {kTinyLlama, [](Json& j) { j["model_type"] = 7; },
       "config.json: model_type: must be a string; got 7"},
      {kTinyLlama, [](Json& j) { j["attention_bias"] = true; },
       "config.json: attention_bias: must be false for LlamaForCausalLM "
       "(it would add an o_proj bias, which Conveyor's llama_block does not "
       "have); got true"},
      {kMistral, [](Json& j) { j["sliding_window"] = 4096; },
       "config.json: sliding_window: must be null (sliding-window attention "
       "is not supported); got 4096"},
      {kMistral, [](Json& j) { j.erase("sliding_window"); },
       "config.json: sliding_window: must be null (sliding-window attention "
       "is not supported); missing means MistralConfig's default of 4096"},
      {kMistral, [](Json& j) { j["attention_bias"] = true; },
       "config.json: attention_bias: must be false for MistralForCausalLM; "
       "got true"},
      {kQwen2, [](Json& j) { j["use_sliding_window"] = true; },
       "config.json: use_sliding_window: must be false (sliding-window "
       "attention is not supported); got true"},
      {kQwen2, [](Json& j) { j["attention_bias"] = false; },
       "config.json: attention_bias: must be true for Qwen2ForCausalLM (its "
       "q/k/v projections always have biases); got false"},
  };
  for (const Refusal& refusal : refusals) {
    const std::string text = Edited(refusal.base, refusal.edit);
    SCOPED_TRACE(text);
    absl::StatusOr<HfLlamaConfig> c = ParseHfLlamaConfig(text, "config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Msg(c.status()), refusal.message);
  }
}

TEST(HfConfigTest, InvalidJsonNamesFileAndPosition) {
  absl::StatusOr<HfLlamaConfig> c =
      ParseHfLlamaConfig("{\n  \"hidden_size\": }", "dir/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(c.status()),
              StartsWith("dir/config.json is not valid JSON: "));
  EXPECT_THAT(Msg(c.status()), HasSubstr("line 2, column 18"));
}

TEST(HfConfigTest, RefusesNonObjectAndDuplicateKeys) {
  absl::StatusOr<HfLlamaConfig> c = ParseHfLlamaConfig("[1, 2]", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(Msg(c.status()), "c.json: must be a JSON object; got array");

  c = ParseHfLlamaConfig(R"({"hidden_size": 8, "hidden_size": 16})", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(c.status()), "c.json has duplicate key 'hidden_size'");
}

TEST(HfConfigTest, ValidateRefusesBadStructs) {
  HfLlamaConfig c = *ParseHfLlamaConfig(kTinyLlama, "x");
  EXPECT_TRUE(ValidateHfLlamaConfig(c, "src").ok());
  c.num_key_value_heads = 0;
  EXPECT_EQ(Msg(ValidateHfLlamaConfig(c, "src")),
            "src: num_key_value_heads: must be an integer in [1, 16777216]; "
            "got 0");
  c = *ParseHfLlamaConfig(kTinyLlama, "x");
  c.architecture = "GemmaForCausalLM";
  EXPECT_EQ(Msg(ValidateHfLlamaConfig(c, "src")),
            "src: architectures: unsupported \"GemmaForCausalLM\"; supported: "
            "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM");
}

TEST(HfConfigTest, WrittenJsonParsesBackToTheSameConfig) {
  for (const char* text : {kTinyLlama, kMistral, kQwen2, kLlama32}) {
    const HfLlamaConfig original = *ParseHfLlamaConfig(text, "x");
    for (HfDType dtype : {HfDType::kBF16, HfDType::kF32}) {
      const std::string written = HfLlamaConfigJson(original, dtype);
      SCOPED_TRACE(written);
      absl::StatusOr<HfLlamaConfig> parsed =
          ParseHfLlamaConfig(written, "written");
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(*parsed, original);
      // The written config states the dtype written (not compared by ==).
      EXPECT_EQ(parsed->torch_dtype, TorchDTypeName(dtype));
      const Json json = Json::parse(written);
      EXPECT_EQ(json["torch_dtype"],
                dtype == HfDType::kBF16 ? "bfloat16" : "float32");
      EXPECT_EQ(json["architectures"], Json::array({original.architecture}));
      EXPECT_EQ(json["rope_scaling"].is_null(), text != kLlama32);
    }
  }
}

TEST(HfConfigTest, RoundTripKeepsRopeScalingHeadDimAndTokenIds) {
  // Llama 3.2's llama3 scaling with a head_dim of its own and a pad id:
  // every value HF reads comes back, in HF's form.
  HfLlamaConfig original = *ParseHfLlamaConfig(Edited(kLlama32,
                                                      [](Json& j) {
                                                        j["head_dim"] = 96;
                                                        j["pad_token_id"] =
                                                            128004;
                                                      }),
                                               "x");
  ASSERT_EQ(original.explicit_head_dim, 96);
  const Json written = Json::parse(HfLlamaConfigJson(original, HfDType::kBF16));
  EXPECT_EQ(written["head_dim"], 96);
  EXPECT_EQ(written["rope_scaling"],
            Json({{"rope_type", "llama3"},
                  {"factor", 32.0},
                  {"low_freq_factor", 1.0},
                  {"high_freq_factor", 4.0},
                  {"original_max_position_embeddings", 8192}}));
  EXPECT_EQ(written["bos_token_id"], 128000);
  EXPECT_EQ(written["eos_token_id"], Json({128001, 128008, 128009}));
  EXPECT_EQ(written["pad_token_id"], 128004);
  EXPECT_EQ(written["tie_word_embeddings"], true);
  EXPECT_EQ(written["max_position_embeddings"], 131072);
  absl::StatusOr<HfLlamaConfig> parsed =
      ParseHfLlamaConfig(written.dump(), "written");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, original);

  // A single eos id stays an integer; absent ids stay absent.
  const Json tiny = Json::parse(
      HfLlamaConfigJson(*ParseHfLlamaConfig(kTinyLlama, "x"), HfDType::kF32));
  EXPECT_EQ(tiny["eos_token_id"], 2);
  EXPECT_FALSE(tiny.contains("pad_token_id"));

  // yarn writes its original length only where it is not
  // max_position_embeddings, and the betas it used.
  for (const int original_length : {2048, 512}) {
    const HfLlamaConfig yarn = *ParseHfLlamaConfig(
        Edited(kTinyLlama,
               [&](Json& j) {
                 j["rope_scaling"] = {
                     {"rope_type", "yarn"},
                     {"factor", 4.0},
                     {"original_max_position_embeddings", original_length}};
               }),
        "x");
    const Json w = Json::parse(HfLlamaConfigJson(yarn, HfDType::kF32));
    EXPECT_EQ(w["rope_scaling"].contains("original_max_position_embeddings"),
              original_length != 2048);
    EXPECT_EQ(w["rope_scaling"]["beta_fast"], 32.0);
    EXPECT_EQ(*ParseHfLlamaConfig(w.dump(), "w"), yarn);
  }
}

TEST(HfConfigTest, EqualityComparesTheModelNotTheStoredDtype) {
  const HfLlamaConfig a = *ParseHfLlamaConfig(kLlama32, "x");
  HfLlamaConfig b = a;
  b.torch_dtype = "float32";
  EXPECT_EQ(a, b);
  b.token_ids.eos.pop_back();
  EXPECT_FALSE(a == b);
  b = a;
  b.rope_scaling.factor = 8;
  EXPECT_FALSE(a == b);
  b = a;
  b.explicit_head_dim = 96;
  EXPECT_FALSE(a == b);
}

TEST(HfConfigTest, ValidateRefusesADynamicLengthOtherThanMaxPositions) {
  HfLlamaConfig c = *ParseHfLlamaConfig(kTinyLlama, "x");
  c.rope_scaling = {.type = engine::RopeType::kDynamic,
                    .factor = 2,
                    .original_max_position_embeddings = 1024};
  EXPECT_EQ(Msg(ValidateHfLlamaConfig(c, "src")),
            "src: rope_scaling.original_max_position_embeddings: must equal "
            "max_position_embeddings (2048) for rope_type dynamic, whose "
            "theta HF grows past max_position_embeddings; got 1024");
}

TEST(HfConfigTest, WrittenJsonCarriesEachArchitecturesKeys) {
  const Json llama = Json::parse(
      HfLlamaConfigJson(*ParseHfLlamaConfig(kTinyLlama, "x"), HfDType::kBF16));
  EXPECT_EQ(llama["model_type"], "llama");
  EXPECT_EQ(llama["attention_bias"], false);
  EXPECT_EQ(llama["mlp_bias"], false);
  EXPECT_EQ(llama["num_key_value_heads"], 4);
  EXPECT_EQ(llama["head_dim"], 64);
  EXPECT_EQ(llama["rms_norm_eps"], 1e-5);

  const Json mistral = Json::parse(
      HfLlamaConfigJson(*ParseHfLlamaConfig(kMistral, "x"), HfDType::kF32));
  EXPECT_EQ(mistral["model_type"], "mistral");
  ASSERT_TRUE(mistral.contains("sliding_window"));
  EXPECT_TRUE(mistral["sliding_window"].is_null());

  const Json qwen2 = Json::parse(
      HfLlamaConfigJson(*ParseHfLlamaConfig(kQwen2, "x"), HfDType::kBF16));
  EXPECT_EQ(qwen2["model_type"], "qwen2");
  EXPECT_EQ(qwen2["use_sliding_window"], false);
  EXPECT_EQ(qwen2["tie_word_embeddings"], true);
  EXPECT_FALSE(qwen2.contains("attention_bias"));
}

}  // namespace
}  // namespace conveyor::hf
