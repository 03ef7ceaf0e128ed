// The job a Conveyor checkpoint is read with (cli/checkpoint_job.h): where
// the recorded job's relative paths pointed, a recorded job that does not
// match its hashes, two imports of the same model named differently, an
// import of another model with the same shapes, an import whose directory
// is gone, and a checkpoint whose tensors are not the job's model.
#include "cli/checkpoint_job.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "cli/checkpoint_params.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/checkpoint.h"
#include "hf/names.h"
#include "job/config_hash.h"
#include "job/job_spec.h"
#include "tests/cli/committed_checkpoint.h"
#include "tests/testing/test_dir.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

RecordedJobDir Infer(const std::string& yaml, const std::string& ckpt) {
  return InferRecordedJobDir(YAML::Load(yaml), ckpt);
}

TEST(InferRecordedJobDirTest, UndoesTheCheckpointDirsPathFromTheJob) {
  // examples/llama.yaml's layout: the job in /src/examples, its
  // checkpoint.dir ../build/examples/llama.
  RecordedJobDir d = Infer("checkpoint: {dir: ../build/examples/llama}",
                           "/src/build/examples/llama");
  ASSERT_TRUE(d.known);
  EXPECT_EQ(d.ancestor, "/src");
  EXPECT_EQ(d.depth, 1);
  EXPECT_EQ(ResolveRecordedPath(d, "../models/x"), "/src/models/x");
  EXPECT_EQ(ResolveRecordedPath(d, "../../up"), "/up");
  // Below the job's own directory, whose name the checkpoint does not give.
  EXPECT_EQ(ResolveRecordedPath(d, "models/x"), std::nullopt);
  EXPECT_EQ(ResolveRecordedPath(d, "/abs//y/"), "/abs/y/");

  d = Infer("checkpoint: {dir: ./a/../ckpt/}", "/src/jobs/ckpt/");
  ASSERT_TRUE(d.known);
  EXPECT_EQ(d.ancestor, "/src/jobs");
  EXPECT_EQ(d.depth, 0);
  EXPECT_EQ(ResolveRecordedPath(d, "m"), "/src/jobs/m");
  EXPECT_EQ(ResolveRecordedPath(d, "../m"), "/src/m");
}

TEST(InferRecordedJobDirTest, UnknownWhenTheCheckpointDirSaysNothing) {
  for (const char* yaml :
       {"name: x", "checkpoint: {dir: /abs/ckpt}", "checkpoint: {}",
        "checkpoint: {dir: ../build/ckpt}", "- a list"}) {
    SCOPED_TRACE(yaml);
    // The last relative one: the checkpoint was moved (other names).
    const RecordedJobDir d = Infer(yaml, "/elsewhere/moved");
    EXPECT_FALSE(d.known);
    EXPECT_EQ(ResolveRecordedPath(d, "../models/x"), std::nullopt);
    EXPECT_EQ(ResolveRecordedPath(d, "/models/x"), "/models/x");
  }
  // More components than the checkpoint's path has.
  EXPECT_FALSE(Infer("checkpoint: {dir: a/b/c}", "/b/c").known);
}

hf::HfLlamaConfig TinyConfig(double rope_theta = 1000) {
  hf::HfLlamaConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.rope_theta = rope_theta;
  c.vocab_size = 40;
  c.max_position_embeddings = 32;
  return c;
}

class CheckpointJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = conveyor::testing_util::FreshTestDir("checkpoint_job_test");
    fs::create_directories(dir_ / "jobs");
    std::ofstream(dir_ / "tokens.bin") << std::string(100, 'a');
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An fp32 HF checkpoint of `config` in dir_/<name>.
  void WriteHf(const std::string& name, const hf::HfLlamaConfig& config) {
    const absl::Status s = hf::WriteHfCheckpoint(
        (dir_ / name).string(), config,
        [&](const std::string& tensor) -> absl::StatusOr<std::vector<float>> {
          for (const auto& [n, shape] : hf::ExpectedLlamaTensors(config)) {
            if (n == tensor) {
              return std::vector<float>(engine::NumElements(shape), 0.5f);
            }
          }
          return absl::NotFoundError(tensor);
        },
        {.dtype = hf::HfDType::kF32});
    ASSERT_TRUE(s.ok()) << s;
  }

  // A job file at dir_/<path> with `model`, checkpointing to dir_/ckpt.
  std::string WriteJob(const std::string& path, const std::string& model,
                       const std::string& steps = "1") {
    const std::string checkpoint_dir =
        path.starts_with("jobs/") ? "../ckpt" : "ckpt";
    const std::string yaml = absl::StrCat(
        "name: llama\n", model,
        "data: {source: tokens, path: ", path.starts_with("jobs/") ? "../" : "",
        "tokens.bin, seq_len: 8}\ntraining: {steps: ", steps,
        ", batch_size: 2}\noptimizer: {kind: sgd, lr: 0.1}\n",
        "checkpoint: {dir: ", checkpoint_dir, "}\n");
    std::ofstream(dir_ / path) << yaml;
    return (dir_ / path).string();
  }

  // Step 3 of the job at `path`, with the manifest recording it (or, with
  // `recorded`, that text instead) and tensors of `model_of` (default: the
  // job's own model).
  void WriteCheckpoint(const std::string& path,
                       const std::string& model_of = "",
                       const std::string& recorded = "") {
    auto text = ReadFile(path);
    ASSERT_TRUE(text.ok());
    auto spec = job::LoadJobSpec(model_of.empty() ? path : model_of);
    ASSERT_TRUE(spec.ok()) << spec.status();
    std::map<std::string, std::vector<float>> values;
    for (const engine::ParamSpec* p : spec->model.Params()) {
      values[p->name] = std::vector<float>(p->NumElements(), 0.25f);
    }
    testing_util::WriteCommittedStep(ckpt(), spec->model, 3,
                                     job::JobConfigHash(*text), values,
                                     recorded.empty() ? *text : recorded);
  }

  absl::StatusOr<CheckpointJob> Resolve(const CheckpointJobOptions& o) {
    auto params = LoadCheckpointParams(ckpt(), std::nullopt);
    if (!params.ok()) return params.status();
    return ResolveCheckpointJob(*params, ckpt(), o);
  }

  std::string ckpt() const { return (dir_ / "ckpt").string(); }

  fs::path dir_;
};

TEST_F(CheckpointJobTest, ARecordedJobThatDoesNotMatchItsHashesIsNotTrusted) {
  const std::string job = WriteJob("job.yaml", testing_util::kLlamaModel);
  std::string edited = *ReadFile(job);
  edited.replace(edited.find("lr: 0.1"), 7, "lr: 0.2");
  WriteCheckpoint(job, "", edited);
  auto r = Resolve({});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("does not match the manifest's configuration hashes"));
  // The file itself still matches by hash.
  r = Resolve({.job_file = job});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, job);
  // Another model with the recorded text untrusted: nothing to compare.
  std::string wide_model = testing_util::kLlamaModel;
  wide_model.replace(wide_model.find("features: 16"), 12, "features: 32");
  r = Resolve({.job_file = WriteJob("wide.yaml", wide_model)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("does not match its hashes, so its model is not "
                        "known"));
}

TEST_F(CheckpointJobTest, TensorsOfAnotherModelAreRefusedByName) {
  // The manifest says job.yaml, but the stage files hold a wider model's
  // tensors (a worker that wrote the wrong thing, a hand-made checkpoint).
  const std::string job = WriteJob("job.yaml", testing_util::kLlamaModel);
  std::string wide_model = testing_util::kLlamaModel;
  wide_model.replace(wide_model.find("features: 16"), 12, "features: 32");
  WriteCheckpoint(job, WriteJob("wide.yaml", wide_model));
  auto r = Resolve({});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("does not hold the parameters of the job recorded "
                        "in"));
  EXPECT_THAT(r.status().message(),
              HasSubstr("layers.0.weight is [40, 32], the model's [40, 16]"));
  EXPECT_THAT(r.status().message(), HasSubstr("more"));
}

TEST_F(CheckpointJobTest, ImportsAreComparedAsTheModelsTheyName) {
  WriteHf("hf", TinyConfig());
  // The job one level down: checkpoint.dir ../ckpt, from_hf ../hf.
  const std::string job = WriteJob(
      "jobs/import.yaml",
      "model:\n  from_hf: ../hf\n  input_shape: [8]\n  boundaries: [1]\n");
  WriteCheckpoint(job);
  // Recorded, with from_hf resolved from where the checkpoint is.
  auto r = Resolve({});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->parsed.spec.model.from_hf, (dir_ / "hf").string());

  // The same directory from another job file, a longer run.
  const std::string here = WriteJob(
      "here.yaml",
      "model:\n  from_hf: hf\n  input_shape: [8]\n  boundaries: [1]\n", "50");
  r = Resolve({.job_file = here});
  ASSERT_TRUE(r.ok()) << r.status();
  // Its data path is written from another directory, and names the same
  // file; neither key makes the model.
  EXPECT_THAT(r->notes, testing::ElementsAre(
                            HasSubstr("only outside its model (data.path, "
                                      "training.steps)")));

  // A copy with an equal config is the same model.
  fs::copy(dir_ / "hf", dir_ / "copy");
  const std::string copy = WriteJob(
      "copy.yaml",
      "model:\n  from_hf: copy\n  input_shape: [8]\n  boundaries: [1]\n");
  EXPECT_TRUE(Resolve({.job_file = copy}).ok());

  // Another rope_theta: the same shapes, another model.
  WriteHf("other", TinyConfig(/*rope_theta=*/500000));
  const std::string other = WriteJob(
      "other.yaml",
      "model:\n  from_hf: other\n  input_shape: [8]\n  boundaries: [1]\n");
  r = Resolve({.job_file = other});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr(absl::StrCat(
                  "model.from_hf names another model (", (dir_ / "hf").string(),
                  " in the checkpoint, ", (dir_ / "other").string(),
                  " in this job: their config.json files "
                  "differ)")));

  // The import is gone: not comparable, so the copy is taken (its tensors
  // are checked), and the recorded job is refused saying how to go on.
  fs::remove_all(dir_ / "hf");
  EXPECT_TRUE(Resolve({.job_file = copy}).ok());
  r = Resolve({});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("--set model.from_hf=DIR"));
  r = Resolve({.overrides = {"model.from_hf=../copy"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->parsed.spec.model.from_hf, (dir_ / "copy").string());
}

TEST_F(CheckpointJobTest, ARelativeImportOfAnUnknownDirectoryNeedsTheJob) {
  WriteHf("hf", TinyConfig());
  // Recorded without a checkpoint.dir that leads here: where "hf" was is
  // not known.
  const std::string job = WriteJob(
      "job.yaml",
      "model:\n  from_hf: hf\n  input_shape: [8]\n  boundaries: [1]\n");
  std::string recorded = *ReadFile(job);
  recorded.replace(recorded.find("checkpoint: {dir: ckpt}"), 23, "");
  // Hashes ignore the checkpoint section, so the text is still trusted.
  ASSERT_EQ(job::JobConfigHash(recorded), job::JobConfigHash(*ReadFile(job)));
  WriteCheckpoint(job, "", recorded);
  auto r = Resolve({});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("imports model.from_hf 'hf', a path relative to its "
                        "job file's directory"));
  EXPECT_THAT(r.status().message(), HasSubstr("--job JOB.yaml"));
  EXPECT_TRUE(Resolve({.job_file = job}).ok());
  EXPECT_TRUE(Resolve({.overrides = {absl::StrCat(
                           "model.from_hf=", dir_.string(), "/hf")}})
                  .ok());
}

}  // namespace
}  // namespace conveyor::cli
