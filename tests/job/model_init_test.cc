// A HuggingFace checkpoint as a job's model (`model: {from_hf: DIR}`): the
// layer list and stages its config gives, the weights loaded into the
// stages bitwise (F32 and BF16 files), the refusals at from_hf's position,
// and the HF config of a Conveyor Llama, which writes a checkpoint that
// reads back to the same parameters.
#include "job/model_init.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/checkpoint.h"
#include "hf/model.h"
#include "hf/names.h"
#include "job/job_spec.h"
#include "tests/engine/test_util.h"
#include "tests/testing/test_dir.h"

namespace conveyor::job {
namespace {

using hf::ExpectedLlamaTensors;
using hf::HfCheckpoint;
using hf::HfConfigOfModel;
using hf::HfDType;
using hf::HfLlamaConfig;
using hf::TorchDTypeName;
using hf::WriteHfCheckpoint;

namespace fs = std::filesystem;
using ::testing::HasSubstr;

HfLlamaConfig TinyConfig() {
  HfLlamaConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.vocab_size = 40;
  c.max_position_embeddings = 32;
  return c;
}

// Values of each tensor, exactly representable in bf16 (multiples of 1/64
// in [-2, 2)), different for every tensor and position.
std::vector<float> ValuesFor(const std::string& name, int64_t n) {
  std::vector<float> v(n);
  const uint32_t salt = static_cast<uint32_t>(std::hash<std::string>()(name));
  for (int64_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(static_cast<int>((salt + i * 2654435761u) % 256) -
                              128) /
           64.0f;
  }
  return v;
}

class HfModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = conveyor::testing_util::FreshTestDir("hf_model_test");
    std::ofstream(dir_ / "tokens.bin") << std::string(200, 'a');
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::Status WriteCheckpoint(const HfLlamaConfig& config, HfDType dtype,
                               const std::string& name = "hf") {
    std::map<std::string, int64_t> sizes;
    for (const auto& [tensor, shape] : ExpectedLlamaTensors(config)) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      sizes[tensor] = n;
    }
    return WriteHfCheckpoint(
        (dir_ / name).string(), config,
        [&](const std::string& tensor) -> absl::StatusOr<std::vector<float>> {
          return ValuesFor(tensor, sizes.at(tensor));
        },
        {.dtype = dtype});
  }

  std::string Job(absl::string_view model) const {
    return absl::StrCat(
        "name: hf\nmodel:\n", model,
        "data: {source: tokens, path: ", (dir_ / "tokens.bin").string(),
        ", seq_len: 8}\ntraining: {steps: 1, batch_size: 2}\n"
        "optimizer: {kind: sgd, lr: 0.1}\n");
  }

  fs::path dir_;
};

TEST_F(HfModelTest, TheConfigGivesTheLayersAndTheBoundariesTheStages) {
  ASSERT_TRUE(WriteCheckpoint(TinyConfig(), HfDType::kF32).ok());
  auto job = ParseJobSpec(
      Job("  from_hf: hf\n  input_shape: [8]\n  boundaries: [1, 2]\n"),
      "job.yaml", dir_.string());
  ASSERT_TRUE(job.ok()) << job.status();
  const engine::ModelSpec& model = job->model;
  EXPECT_EQ(model.from_hf, (dir_ / "hf").string());
  ASSERT_EQ(model.layers.size(), 6u);
  EXPECT_EQ(model.layers[0].kind, engine::LayerKind::kEmbedding);
  for (int i = 1; i <= 3; ++i) {
    EXPECT_EQ(model.layers[i].kind, engine::LayerKind::kLlamaBlock);
    EXPECT_EQ(model.layers[i].kv_heads, 2);
    EXPECT_DOUBLE_EQ(model.layers[i].rope_theta, 500000);
  }
  EXPECT_EQ(model.layers[4].kind, engine::LayerKind::kRmsNorm);
  EXPECT_DOUBLE_EQ(model.layers[4].eps, 1e-5);
  EXPECT_EQ(model.layers[5].kind, engine::LayerKind::kLmHead);
  // Stages begin at blocks 1 and 2: layers 2 and 3.
  EXPECT_EQ(model.stage_begin, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(model.num_stages, 3);
  EXPECT_EQ(model.loss, engine::LossKind::kCrossEntropy);
  EXPECT_EQ(model.target_shape, (std::vector<int64_t>{8}));
  EXPECT_TRUE(model.token_input);
  std::map<std::string, std::vector<int64_t>> declared, expected;
  for (const engine::ParamSpec* p : model.Params())
    declared[p->name] = p->shape;
  for (const auto& [name, shape] : ExpectedLlamaTensors(TinyConfig())) {
    expected[name] = shape;
  }
  EXPECT_EQ(declared, expected);
}

TEST_F(HfModelTest, StagesLoadTheCheckpointBitwise) {
  for (HfDType dtype : {HfDType::kF32, HfDType::kBF16}) {
    SCOPED_TRACE(TorchDTypeName(dtype));
    fs::remove_all(dir_ / "hf");
    ASSERT_TRUE(WriteCheckpoint(TinyConfig(), dtype).ok());
    auto job = ParseJobSpec(
        Job("  from_hf: hf\n  input_shape: [8]\n  boundaries: [2]\n"),
        "job.yaml", dir_.string());
    ASSERT_TRUE(job.ok()) << job.status();
    std::vector<std::unique_ptr<engine::Stage>> owned;
    std::vector<engine::PipelineStage*> stages;
    for (int s = 0; s < job->model.num_stages; ++s) {
      auto stage =
          engine::Stage::Create(engine::CpuBackend::Get(), job->model, s);
      ASSERT_TRUE(stage.ok()) << stage.status();
      stages.push_back(stage->get());
      owned.push_back(*std::move(stage));
    }
    ASSERT_TRUE(InitializeStages(job->model, stages).ok());
    int checked = 0;
    for (auto& stage : owned) {
      for (engine::Parameter* p : stage->parameters()) {
        EXPECT_EQ(engine::testing_util::ToVector(p->value),
                  ValuesFor(p->name, p->value.numel()))
            << p->name;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 3 + 9 * 3);
  }
}

// tie_word_embeddings: the lm_head is tied to the embedding. The model
// holds the embedding once (no lm_head.weight, which the checkpoint does not
// store), the last stage holds a copy that loads the embedding's values,
// and the model's HF config says tied again.
TEST_F(HfModelTest, ATiedCheckpointTiesTheHeadToTheEmbedding) {
  HfLlamaConfig tied = TinyConfig();
  tied.tie_word_embeddings = true;
  ASSERT_TRUE(WriteCheckpoint(tied, HfDType::kBF16).ok());
  auto job = ParseJobSpec(
      Job("  from_hf: hf\n  input_shape: [8]\n  boundaries: [2]\n"), "job.yaml",
      dir_.string());
  ASSERT_TRUE(job.ok()) << job.status();
  const engine::ModelSpec& model = job->model;
  EXPECT_TRUE(model.layers.back().tied);
  std::map<std::string, std::vector<int64_t>> declared, expected;
  for (const engine::ParamSpec* p : model.Params())
    declared[p->name] = p->shape;
  for (const auto& [name, shape] : ExpectedLlamaTensors(tied)) {
    expected[name] = shape;
  }
  EXPECT_EQ(declared, expected);
  EXPECT_EQ(
      model.TiedParameters(),
      (std::vector<engine::TiedParameter>{
          {.name = "layers.0.weight", .original_stage = 0, .copy_stage = 1}}));
  std::vector<std::unique_ptr<engine::Stage>> owned;
  std::vector<engine::PipelineStage*> stages;
  for (int s = 0; s < model.num_stages; ++s) {
    auto stage = engine::Stage::Create(engine::CpuBackend::Get(), model, s);
    ASSERT_TRUE(stage.ok()) << stage.status();
    stages.push_back(stage->get());
    owned.push_back(*std::move(stage));
  }
  ASSERT_TRUE(InitializeStages(model, stages).ok());
  engine::Parameter* copy =
      engine::FindParameter(*stages[1], "layers.0.weight", /*copy=*/true);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(engine::testing_util::ToVector(copy->value),
            ValuesFor("layers.0.weight", copy->value.numel()));
  auto config = HfConfigOfModel(model);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->tie_word_embeddings);
}

TEST_F(HfModelTest, WhatTheCheckpointCannotGiveIsRefusedAtFromHf) {
  ASSERT_TRUE(WriteCheckpoint(TinyConfig(), HfDType::kF32).ok());
  auto error = [&](absl::string_view model) {
    auto job = ParseJobSpec(Job(model), "job.yaml", dir_.string());
    EXPECT_FALSE(job.ok());
    return std::string(job.status().message());
  };
  EXPECT_THAT(error("  from_hf: hf\n  input_shape: [8]\n  boundaries: [3]\n"),
              HasSubstr("model.from_hf: boundary 3 is not a block where a "
                        "stage can begin: the checkpoint has 3 blocks"));
  EXPECT_THAT(error("  from_hf: hf\n  input_shape: [33]\n"),
              HasSubstr("input_shape has 33 tokens, more than the "
                        "checkpoint's max_position_embeddings (32)"));
  EXPECT_THAT(error("  from_hf: nothing-here\n  input_shape: [8]\n"),
              HasSubstr("job.yaml:3:12: model.from_hf: "));
  EXPECT_THAT(error("  from_hf: nothing-here\n  input_shape: [8]\n"),
              HasSubstr("no such HuggingFace checkpoint directory"));
  EXPECT_THAT(error("  from_hf: hf\n  input_shape: [8]\n  layers: [relu]\n"),
              HasSubstr("model.layers: a model from_hf takes its layers and "
                        "weights from the checkpoint; remove 'layers'"));
  EXPECT_THAT(error("  from_hf: hf\n  input_shape: [8, 16]\n"),
              HasSubstr("input_shape is [seq]; got [8, 16]"));
  EXPECT_THAT(error("  from_hf: hf\n  input_shape: [8]\n  boundaries: [2, "
                    "1]\n"),
              HasSubstr("must be greater than the boundary before it (2)"));
  EXPECT_THAT(error("  from_hf: hf\n  input_shape: [8]\n  loss: mse\n"),
              HasSubstr("model.loss"));
  EXPECT_THAT(error("  input_shape: [8]\n  init: {seed: 1}\n  boundaries: "
                    "[1]\n  loss: mse\n  layers: [relu]\n"),
              HasSubstr("boundaries cut a model from_hf"));
}

TEST_F(HfModelTest, AConveyorLlamaExportsAndReadsBackBitwise) {
  // Import, export through the model's HF config, import again: the same
  // parameters, bit for bit (fp32).
  ASSERT_TRUE(WriteCheckpoint(TinyConfig(), HfDType::kF32).ok());
  auto job = ParseJobSpec(Job("  from_hf: hf\n  input_shape: [8]\n"),
                               "job.yaml", dir_.string());
  ASSERT_TRUE(job.ok()) << job.status();
  auto config = HfConfigOfModel(job->model, 32);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, TinyConfig());
  auto original = HfCheckpoint::Open((dir_ / "hf").string());
  ASSERT_TRUE(original.ok()) << original.status();
  ASSERT_TRUE(WriteHfCheckpoint((dir_ / "again").string(), *config,
                                [&](const std::string& name) {
                                  return original->ReadConveyorTensor(name);
                                },
                                {.dtype = HfDType::kF32})
                  .ok());
  auto again = HfCheckpoint::Open((dir_ / "again").string());
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->CheckComplete().ok());
  for (const auto& [name, shape] : ExpectedLlamaTensors(TinyConfig())) {
    EXPECT_EQ(*again->ReadConveyorTensor(name),
              *original->ReadConveyorTensor(name))
        << name;
  }
}

TEST(HfConfigOfModelTest, NamesTheFirstLayerOutsideTheLlamaLayout) {
  auto model = engine::ParseModelSpecYaml(R"(model:
  input_shape: [8]
  init: {seed: 1}
  loss: cross_entropy
  layers:
    - embedding: {vocab_size: 40, features: 16}
    - llama_block: {heads: 4, mlp_features: 24}
    - transformer_block: {heads: 4, mlp_features: 24}
    - rmsnorm
    - lm_head: {vocab_size: 40}
)",
                                          "job.yaml");
  ASSERT_TRUE(model.ok()) << model.status();
  auto config = HfConfigOfModel(*model);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(),
              HasSubstr("job.yaml:8:7: model.layers[2]: transformer_block "
                        "(layer 2): the model does not have the Llama "
                        "layout"));
}

}  // namespace
}  // namespace conveyor::job
