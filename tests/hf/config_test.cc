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
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       "config.json: rope_scaling: must be null (RoPE scaling is not "
       "supported); got {\"factor\":2.0,\"type\":\"linear\"}"},
      {kTinyLlama, [](Json& j) { j["head_dim"] = 128; },
       "config.json: head_dim: must be hidden_size / num_attention_heads = "
       "64; got 128"},
      {kTinyLlama, [](Json& j) { j["hidden_act"] = "gelu"; },
       "config.json: hidden_act: must be \"silu\"; got \"gelu\""},
      {kTinyLlama, [](Json& j) { j["mlp_bias"] = true; },
       "config.json: mlp_bias: must be false (MLP biases are not "
       "supported); got true"},
      {kTinyLlama, [](Json& j) { j["num_attention_heads"] = 30; },
       "config.json: num_attention_heads: must divide hidden_size = 2048; "
       "got 30"},
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
  for (const char* text : {kTinyLlama, kMistral, kQwen2}) {
    const HfLlamaConfig original = *ParseHfLlamaConfig(text, "x");
    for (HfDType dtype : {HfDType::kBF16, HfDType::kF32}) {
      const std::string written = HfLlamaConfigJson(original, dtype);
      SCOPED_TRACE(written);
      absl::StatusOr<HfLlamaConfig> parsed =
          ParseHfLlamaConfig(written, "written");
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(*parsed, original);
      const Json json = Json::parse(written);
      EXPECT_EQ(json["torch_dtype"],
                dtype == HfDType::kBF16 ? "bfloat16" : "float32");
      EXPECT_EQ(json["architectures"], Json::array({original.architecture}));
      EXPECT_TRUE(json["rope_scaling"].is_null());
    }
  }
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
