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
                       const std::string& lr = "0.1",
                       const std::string& steps = "1") {
    const std::string yaml = absl::StrCat(
        "name: llama\n", model, "data: {source: tokens, path: tokens.bin, ",
        "seq_len: 8}\ntraining: {steps: ", steps, ", batch_size: 2}\n",
        "optimizer: {kind: sgd, lr: ", lr, "}\ncheckpoint: {dir: ckpt}\n");
    const fs::path path = dir_ / name;
    std::ofstream(path) << yaml;
    return path.string();
  }

  // The job's initial parameters written as a committed checkpoint step, as
  // workers and the coordinator write one (recording the job file when
  // `record_job`, as the coordinator does now); returns every parameter.
  std::map<std::string, std::vector<float>> WriteCheckpoint(
      const std::string& job_path, bool record_job = false) {
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
                                     job::JobConfigHash(text.str()), values,
                                     record_job ? text.str() : "");
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
    auto r = ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt, out,
                                  {.job_file = job, .dtype = dtype});
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
  ASSERT_TRUE(
      ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt,
                           (dir_ / "original").string(),
                           {.job_file = first, .dtype = hf::HfDType::kF32})
          .ok());
  fs::remove_all(dir_ / "ckpt");
  const std::string imported =
      WriteJob("imported.yaml",
               "model:\n  from_hf: original\n  input_shape: [8]\n"
               "  boundaries: [1]\n");
  WriteCheckpoint(imported);
  auto r = ExportCheckpointToHf(
      (dir_ / "ckpt").string(), std::nullopt, (dir_ / "again").string(),
      {.job_file = imported, .dtype = hf::HfDType::kF32});
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
  auto r = ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt,
                                (dir_ / "tied").string(),
                                {.job_file = job, .dtype = hf::HfDType::kF32});
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
  ASSERT_TRUE(
      ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt,
                           (dir_ / "again").string(),
                           {.job_file = imported, .dtype = hf::HfDType::kF32})
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
  auto r =
      ExportCheckpointToHf(ckpt, std::nullopt, (dir_ / "out").string(),
                           {.job_file = other, .dtype = hf::HfDType::kBF16});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("other.yaml is not the job that wrote"));

  std::ostringstream out;
  EXPECT_THAT(RunExportCommand({.checkpoint_dir = ckpt,
                                .output = (dir_ / "x").string(),
                                .format = "hf"},
                               out)
                  .message(),
              HasSubstr("does not record the job that wrote it"));
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
  auto r = ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt,
                                (dir_ / "out").string(),
                                {.job_file = job, .dtype = hf::HfDType::kBF16});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("transformer_block (layer 1): the model does not "
                        "have the Llama layout"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "config.json"));
}

// The README's path: `export --format hf` with no --job reads the job the
// manifest records; a --job that differs only outside the model (a longer
// run) is accepted with a note; one of another width is refused naming the
// key.
TEST_F(ExportHfTest, TheRecordedJobOrAJobOfTheSameModelExports) {
  const std::string job = WriteJob("job.yaml", testing_util::kLlamaModel);
  const auto values = WriteCheckpoint(job, /*record_job=*/true);
  const std::string ckpt = (dir_ / "ckpt").string();
  std::ostringstream out;
  ASSERT_TRUE(RunExportCommand({.checkpoint_dir = ckpt,
                                .output = (dir_ / "recorded").string(),
                                .format = "hf",
                                .dtype = "fp32"},
                               out)
                  .ok());
  auto hf = hf::HfCheckpoint::Open((dir_ / "recorded").string());
  ASSERT_TRUE(hf.ok()) << hf.status();
  for (const auto& [param, want] : values) {
    EXPECT_EQ(*hf->ReadConveyorTensor(param), want) << param;
  }

  const std::string longer =
      WriteJob("longer.yaml", testing_util::kLlamaModel, "0.1", /*steps=*/"60");
  out.str("");
  const absl::Status s = RunExportCommand({.checkpoint_dir = ckpt,
                                           .output = (dir_ / "longer").string(),
                                           .format = "hf",
                                           .job = longer},
                                          out);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(out.str(), HasSubstr("only outside its model (training.steps)"));

  std::string wide_model = testing_util::kLlamaModel;
  wide_model.replace(wide_model.find("features: 16"), 12, "features: 32");
  const std::string wide = WriteJob("wide.yaml", wide_model);
  auto r = ExportCheckpointToHf(ckpt, std::nullopt, (dir_ / "wide").string(),
                                {.job_file = wide});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("model.layers[0].embedding.features differs (16 in "
                        "the checkpoint, 32 in this job)"));
  EXPECT_FALSE(fs::exists(dir_ / "wide"));
  // --set applies to the recorded job, and may not change the model.
  r = ExportCheckpointToHf(
      ckpt, std::nullopt, (dir_ / "heads").string(),
      {.overrides = {"model.layers.1.llama_block.heads=2"}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("model.layers[1].llama_block.heads differs (4 in "
                        "the checkpoint, 2 in this job)"));
}

// --overwrite replaces an earlier export whole; without it the earlier one
// is refused untouched, and what is not an export is never replaced.
TEST_F(ExportHfTest, OverwriteReplacesOnlyAnEarlierExport) {
  const std::string job = WriteJob("job.yaml", testing_util::kLlamaModel);
  WriteCheckpoint(job, /*record_job=*/true);
  const std::string ckpt = (dir_ / "ckpt").string();
  const fs::path y = dir_ / "y";
  auto run = [&](const fs::path& output, bool overwrite,
                 const std::string& dtype) {
    std::ostringstream out;
    return RunExportCommand({.checkpoint_dir = ckpt,
                             .output = output.string(),
                             .format = "hf",
                             .dtype = dtype,
                             .overwrite = overwrite},
                            out);
  };
  ASSERT_TRUE(run(y, false, "bf16").ok());
  const auto bf16_size = fs::file_size(y / hf::kHfWeightsFile);
  const absl::Status again = run(y, false, "fp32");
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.message(), HasSubstr("--overwrite replaces it"));
  EXPECT_EQ(fs::file_size(y / hf::kHfWeightsFile), bf16_size);
  std::ofstream(y / "stale.txt") << "from before";
  ASSERT_TRUE(run(y, true, "fp32").ok());
  // fp32 stores twice the bytes of each tensor; the old directory is gone
  // whole, its stray file with it, and no staging directory is left.
  EXPECT_GT(fs::file_size(y / hf::kHfWeightsFile), bf16_size);
  EXPECT_FALSE(fs::exists(y / "stale.txt"));
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_NE(entry.path().filename().string()[0], '.') << entry.path();
  }

  std::ofstream(dir_ / "file") << "not a directory";
  EXPECT_EQ(run(dir_ / "file", true, "bf16").code(),
            absl::StatusCode::kFailedPrecondition);
  fs::create_directory(dir_ / "notes");
  std::ofstream(dir_ / "notes" / "todo.txt") << "mine";
  const absl::Status unrelated = run(dir_ / "notes", true, "bf16");
  EXPECT_EQ(unrelated.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unrelated.message(),
              HasSubstr("is not empty and is not an HF checkpoint"));
  EXPECT_TRUE(fs::exists(dir_ / "notes" / "todo.txt"));
  EXPECT_EQ(run(dir_ / "ckpt", true, "bf16").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(run(dir_, true, "bf16").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "step-3"));
  // A failed export leaves nothing, not even the output's parents.
  std::ostringstream out;
  EXPECT_EQ(RunExportCommand({.checkpoint_dir = (dir_ / "absent").string(),
                              .output = (dir_ / "new" / "hf").string(),
                              .format = "hf"},
                             out)
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(dir_ / "new"));
}

// A model imported from an HF directory exports with the tokenizer files
// that directory holds, byte for byte; without a tokenizer there, the
// export still succeeds and warns; --tokenizer names the files instead.
TEST_F(ExportHfTest, AnImportedModelCarriesItsTokenizerFiles) {
  WriteCheckpoint(WriteJob("seed.yaml", testing_util::kLlamaModel));
  const fs::path original = dir_ / "original";
  ASSERT_TRUE(ExportCheckpointToHf((dir_ / "ckpt").string(), std::nullopt,
                                   original.string(),
                                   {.job_file = (dir_ / "seed.yaml").string(),
                                    .dtype = hf::HfDType::kF32})
                  .ok());
  fs::remove_all(dir_ / "ckpt");
  const std::map<std::string, std::string> files = {
      {"tokenizer.json", R"({"model": {"type": "BPE"}})"},
      {"tokenizer_config.json", R"({"bos_token": "<s>"})"},
      {"special_tokens_map.json", R"({"eos_token": "</s>"})"},
      {"generation_config.json", R"({"bos_token_id": 1})"}};
  for (const auto& [name, text] : files) std::ofstream(original / name) << text;
  const std::string imported = WriteJob(
      "imported.yaml",
      "model:\n  from_hf: original\n  input_shape: [8]\n  boundaries: [1]\n");
  WriteCheckpoint(imported, /*record_job=*/true);
  const std::string ckpt = (dir_ / "ckpt").string();

  auto r =
      ExportCheckpointToHf(ckpt, std::nullopt, (dir_ / "out").string(), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->warnings.empty());
  EXPECT_EQ(r->tokenizer_source, original.string());
  EXPECT_EQ(r->tokenizer_files.size(), files.size());
  for (const auto& [name, text] : files) {
    std::ifstream in(dir_ / "out" / name);
    std::stringstream got;
    got << in.rdbuf();
    EXPECT_EQ(got.str(), text) << name;
  }

  fs::remove(original / "tokenizer.json");
  std::ostringstream out;
  ASSERT_TRUE(RunExportCommand({.checkpoint_dir = ckpt,
                                .output = (dir_ / "out").string(),
                                .format = "hf",
                                .overwrite = true},
                               out)
                  .ok());
  EXPECT_THAT(out.str(), HasSubstr("warning: " + original.string() +
                                   ", which the model was imported from, "
                                   "holds neither tokenizer.json nor "
                                   "tokenizer.model"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "tokenizer_config.json"));

  const fs::path elsewhere = dir_ / "tokenizer.model";
  std::ofstream(elsewhere) << "sentencepiece";
  r = ExportCheckpointToHf(
      ckpt, std::nullopt, (dir_ / "out").string(),
      {.overwrite = true, .tokenizer = {elsewhere.string()}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokenizer_files, std::vector<std::string>{"tokenizer.model"});
  EXPECT_TRUE(fs::exists(dir_ / "out" / "tokenizer.model"));
  // Only what --tokenizer names: not the import's files.
  EXPECT_FALSE(fs::exists(dir_ / "out" / "tokenizer_config.json"));
  // The import itself is never the output.
  r = ExportCheckpointToHf(ckpt, std::nullopt, original.string(),
                           {.overwrite = true});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("the checkpoint the model was imported from"));
  EXPECT_TRUE(fs::exists(original / "tokenizer_config.json"));
}

}  // namespace
}  // namespace conveyor::cli
