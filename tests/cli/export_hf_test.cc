// `conveyorctl export --format hf`: a pipelined Llama job's checkpoint
// becomes a HuggingFace checkpoint with the stage files' values (bitwise in
// fp32, rounded to nearest even in bf16); a job imported from_hf exports
// back to its original files bit for bit; another job's file, a model of
// another layout and bad flags are refused.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/stage_file.h"
#include "cli/export_command.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/checkpoint.h"
#include "hf/names.h"
#include "job/config_hash.h"
#include "job/job_spec.h"
#include "job/model_init.h"
#include "tests/cli/committed_checkpoint.h"
#include "tests/engine/test_util.h"
#include "tests/testing/test_dir.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// `v` rounded to bfloat16, to nearest even, back as float (no NaN here).
float RoundToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  bits &= 0xFFFF0000u;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

class ExportHfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = conveyor::testing_util::FreshTestDir("export_hf_test");
    std::ofstream(dir_ / "tokens.bin") << std::string(100, 'a');
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a job file and returns its path.
  std::string WriteJob(const std::string& name, const std::string& model,
                       const std::string& lr = "0.1") {
    const std::string yaml = absl::StrCat(
        "name: llama\n", model, "data: {source: tokens, path: tokens.bin, ",
        "seq_len: 8}\ntraining: {steps: 1, batch_size: 2}\n",
        "optimizer: {kind: sgd, lr: ", lr, "}\n");
    const fs::path path = dir_ / name;
    std::ofstream(path) << yaml;
    return path.string();
  }

  // The job's initial parameters written as a committed checkpoint step, as
  // workers and the coordinator write one; returns every parameter.
  std::map<std::string, std::vector<float>> WriteCheckpoint(
      const std::string& job_path) {
    std::ifstream in(job_path);
    std::stringstream text;
    text << in.rdbuf();
    auto job = job::LoadJobSpec(job_path);
    EXPECT_TRUE(job.ok()) << job.status();
    std::map<std::string, std::vector<float>> values;
    for (int s = 0; s < job->model.num_stages; ++s) {
      auto stage =
          engine::Stage::Create(engine::CpuBackend::Get(), job->model, s);
      EXPECT_TRUE(stage.ok()) << stage.status();
      engine::PipelineStage* p = stage->get();
      EXPECT_TRUE(job::InitializeStages(job->model, {&p, 1}).ok());
      for (engine::Parameter* param : (*stage)->parameters()) {
        values[param->name] = engine::testing_util::ToVector(param->value);
      }
    }
    testing_util::WriteCommittedStep((dir_ / "ckpt").string(), job->model, 3,
                                     job::JobConfigHash(text.str()), values);
    return values;
  }

  fs::path dir_;
};

TEST_F(ExportHfTest, StageFilesBecomeAnHfCheckpoint) {
  const std::string job = WriteJob("job.yaml", testing_util::kLlamaModel);
  const auto values = WriteCheckpoint(job);
  for (const auto& [dtype, name] :
       {std::pair{hf::HfDType::kF32, "fp32"}, {hf::HfDType::kBF16, "bf16"}}) {
    SCOPED_TRACE(name);
    const std::string out = (dir_ / name).string();
    auto r = ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt, job,
                                  out, dtype);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, 3);
    EXPECT_EQ(r->num_tensors, 3 + 9 * 2);
    auto hf = hf::HfCheckpoint::Open(out);
    ASSERT_TRUE(hf.ok()) << hf.status();
    ASSERT_TRUE(hf->CheckComplete().ok()) << hf->CheckComplete();
    EXPECT_EQ(hf->config().architecture, "LlamaForCausalLM");
    EXPECT_EQ(hf->config().num_key_value_heads, 2);
    EXPECT_DOUBLE_EQ(hf->config().rope_theta, 1000);
    EXPECT_EQ(hf->config().max_position_embeddings, 8);
    for (const auto& [param, want] : values) {
      auto got = hf->ReadConveyorTensor(param);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        if (dtype == hf::HfDType::kF32) {
          ASSERT_EQ((*got)[i], want[i]) << param << "[" << i << "]";
        } else {
          ASSERT_EQ((*got)[i], RoundToBf16(want[i]))
              << param << "[" << i << "]";
        }
      }
    }
  }
}

TEST_F(ExportHfTest, AnImportedModelExportsBackBitwise) {
  // An HF checkpoint (fp32) imported by a job, checkpointed, exported:
  // the same tensors, bit for bit, under the same architecture.
  const std::string first = WriteJob("seed.yaml", testing_util::kLlamaModel);
  WriteCheckpoint(first);
  ASSERT_TRUE(ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt,
                                   first, (dir_ / "original").string(),
                                   hf::HfDType::kF32)
                  .ok());
  fs::remove_all(dir_ / "ckpt");
  const std::string imported =
      WriteJob("imported.yaml",
               "model:\n  from_hf: original\n  input_shape: [8]\n"
               "  boundaries: [1]\n");
  WriteCheckpoint(imported);
  auto r =
      ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt, imported,
                           (dir_ / "again").string(), hf::HfDType::kF32);
  ASSERT_TRUE(r.ok()) << r.status();
  auto original = hf::HfCheckpoint::Open((dir_ / "original").string());
  auto again = hf::HfCheckpoint::Open((dir_ / "again").string());
  ASSERT_TRUE(original.ok() && again.ok());
  EXPECT_EQ(again->config(), original->config());
  for (const auto& [name, shape] : hf::ExpectedLlamaTensors(again->config())) {
    EXPECT_EQ(*again->ReadConveyorTensor(name),
              *original->ReadConveyorTensor(name))
        << name;
  }
}

// A tied model exports its embedding once, with tie_word_embeddings and no
// lm_head.weight, as HF stores one; imported again it is tied again, and a
// second export gives the same files' tensors bit for bit.
TEST_F(ExportHfTest, ATiedModelExportsTheEmbeddingOnce) {
  std::string model = testing_util::kLlamaModel;
  model.replace(model.find("lm_head: {vocab_size: 40}"),
                std::string("lm_head: {vocab_size: 40}").size(),
                "lm_head: {vocab_size: 40, tied: true}");
  const std::string job = WriteJob("tied.yaml", model);
  const auto values = WriteCheckpoint(job);
  auto r = ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt, job,
                                (dir_ / "tied").string(), hf::HfDType::kF32);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_tensors, 2 + 9 * 2);
  auto hf = hf::HfCheckpoint::Open((dir_ / "tied").string());
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_TRUE(hf->config().tie_word_embeddings);
  // Complete without lm_head.weight (it would be an unexpected tensor).
  ASSERT_TRUE(hf->CheckComplete().ok()) << hf->CheckComplete();
  EXPECT_EQ(*hf->ReadConveyorTensor("layers.0.weight"),
            values.at("layers.0.weight"));

  fs::remove_all(dir_ / "ckpt");
  const std::string imported = WriteJob(
      "imported.yaml",
      "model:\n  from_hf: tied\n  input_shape: [8]\n  boundaries: [1]\n");
  auto spec = job::LoadJobSpec(imported);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->model.layers.back().tied);
  WriteCheckpoint(imported);
  ASSERT_TRUE(ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt,
                                   imported, (dir_ / "again").string(),
                                   hf::HfDType::kF32)
                  .ok());
  auto again = hf::HfCheckpoint::Open((dir_ / "again").string());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->config(), hf->config());
  for (const auto& [name, shape] : hf::ExpectedLlamaTensors(again->config())) {
    EXPECT_EQ(*again->ReadConveyorTensor(name), *hf->ReadConveyorTensor(name))
        << name;
  }
}

TEST_F(ExportHfTest, RefusesAnotherJobAnotherLayoutAndBadFlags) {
  const std::string job = WriteJob("job.yaml", testing_util::kLlamaModel);
  WriteCheckpoint(job);
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string other =
      WriteJob("other.yaml", testing_util::kLlamaModel, "0.2");
  auto r = ExportCheckpointToHf(ckpt, std::nullopt, other,
                                (dir_ / "out").string(), hf::HfDType::kBF16);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("other.yaml is not the job that wrote"));

  std::ostringstream out;
  EXPECT_THAT(RunExportCommand({.checkpoint_dir = ckpt,
                                .output = (dir_ / "x").string(),
                                .format = "hf"},
                               out)
                  .message(),
              HasSubstr("--format hf needs --job JOB.yaml"));
  EXPECT_THAT(RunExportCommand({.checkpoint_dir = ckpt,
                                .output = (dir_ / "x").string(),
                                .format = "onnx"},
                               out)
                  .message(),
              HasSubstr("--format must be safetensors or hf; got 'onnx'"));
  EXPECT_THAT(RunExportCommand({.checkpoint_dir = ckpt,
                                .output = (dir_ / "x").string(),
                                .format = "hf",
                                .job = job,
                                .dtype = "fp16"},
                               out)
                  .message(),
              HasSubstr("--dtype must be bf16 or fp32; got 'fp16'"));
  // The output holds a checkpoint already: never overwritten.
  ASSERT_TRUE(RunExportCommand({.checkpoint_dir = ckpt,
                                .output = (dir_ / "y").string(),
                                .format = "hf",
                                .job = job},
                               out)
                  .ok());
  EXPECT_EQ(RunExportCommand({.checkpoint_dir = ckpt,
                              .output = (dir_ / "y").string(),
                              .format = "hf",
                              .job = job},
                             out)
                .code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(ExportHfTest, AModelOfAnotherLayoutIsRefusedNamingTheLayer) {
  const std::string job = WriteJob("mlp.yaml", R"(model:
  input_shape: [8]
  init: {seed: 5}
  loss: cross_entropy
  layers:
    - embedding: {vocab_size: 40, features: 16}
    - transformer_block: {heads: 4, mlp_features: 24}
    - boundary
    - rmsnorm
    - lm_head: {vocab_size: 40}
)");
  WriteCheckpoint(job);
  auto r = ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt, job,
                                (dir_ / "out").string(), hf::HfDType::kBF16);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("transformer_block (layer 1): the model does not "
                        "have the Llama layout"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "config.json"));
}

}  // namespace
}  // namespace conveyor::cli
